"""One rank of the immutable-scalar check (`accord run -n N python worker_scalars.py`).

numpy scalars (what `x.sum()` returns), Python floats and ints cannot be written in place: every
operation reads them as one-element arrays, and where it writes one it returns the result as a
new scalar of the same type. 0-d arrays are ordinary arrays, changed in place. Inputs are random,
derived from a shared seed so that every rank computes the numpy reference. Prints
`SCALARS-OK <rank>` at the end.
"""

import sys

import numpy as np

import accord

comm = accord.init(timeout=60)
n, me = comm.size, comm.rank
DTYPES = [np.dtype(d) for d in (np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint32, np.uint64)]


def value(rank, dtype, salt=0):
    """Rank `rank`'s random scalar of `dtype` (small integers: exact sums and products)."""
    rng = np.random.default_rng(7919 * rank + 31 * salt + dtype.num)
    lo = 0 if dtype.kind == "u" else -3
    return dtype.type(rng.integers(lo, 4))


def values(rank, dtype, count, salt):
    rng = np.random.default_rng(104729 * rank + 31 * salt + dtype.num + count)
    lo = 0 if dtype.kind == "u" else -3
    return rng.integers(lo, 4, size=count).astype(dtype)


def fail(what, got, want):
    print(f"FAIL rank {me} {what}: got {got!r} want {want!r}", flush=True)
    sys.exit(1)


def same(what, got, want):
    """`got` has `want`'s type and value."""
    if type(got) is not type(want) or not (got == want or (got != got and want != want)):
        fail(what, got, want)


REDUCE = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max}


def ref(op, dtype, salt=0):
    return dtype.type(REDUCE[op](np.array([value(r, dtype, salt) for r in range(n)], dtype)))


for dt in DTYPES:
    mine = value(me, dt)
    for op in REDUCE:
        # In place on a numpy scalar: a new scalar comes back, of the same type.
        same(f"allreduce {op} {dt}", comm.allreduce(mine, op=op), ref(op, dt))
        same(f"allreduce {op} {dt} async", comm.allreduce(mine, op=op, async_op=True).wait(30), ref(op, dt))
        same(f"allreduce {op} {dt} scalar out", comm.allreduce(mine, op=op, out=dt.type(0)), ref(op, dt))
        out = np.zeros((), dt)
        assert comm.allreduce(mine, op=op, out=out) is out
        same(f"allreduce {op} {dt} into 0-d", out[()], ref(op, dt))
        # A 0-d array is mutable: reduced in place, the same object returned.
        zd = np.array(mine)
        assert comm.allreduce(zd, op=op) is zd
        same(f"allreduce {op} {dt} 0-d in place", zd[()], ref(op, dt))
        for root in {0, n - 1}:
            got = comm.reduce(mine, op=op, root=root)
            same(f"reduce {op} {dt} root {root}", got, ref(op, dt) if me == root else mine)
    for root in {0, n - 1}:
        same(f"broadcast {dt} root {root}", comm.broadcast(mine, root=root), value(root, dt))
        same(f"broadcast {dt} async", comm.broadcast(mine, root=root, async_op=True).wait(30), value(root, dt))
    # Scalars as inputs of the gathering operations.
    everyone = np.array([value(r, dt) for r in range(n)], dt)
    out = np.zeros(n, dt)
    comm.allgather(mine, out)
    if not np.array_equal(out, everyone):
        fail(f"allgather {dt}", out, everyone)
    out = np.zeros(n, dt) if me == n - 1 else None
    comm.gather(mine, out, root=n - 1)
    if me == n - 1 and not np.array_equal(out, everyone):
        fail(f"gather {dt}", out, everyone)
    # Scalars as outputs of the distributing operations.
    src = values(0, dt, n, 1)
    same(f"scatter {dt}", comm.scatter(src if me == 0 else None, dt.type(0), root=0), src[me])
    big = [values(r, dt, n, 2) for r in range(n)]
    want = dt.type(np.sum(np.stack(big), axis=0, dtype=dt)[me])
    same(f"reduce_scatter {dt}", comm.reduce_scatter(big[me], dt.type(0)), want)
    right, left = (me + 1) % n, (me - 1) % n
    same(f"sendrecv {dt}", comm.sendrecv(mine, right, dt.type(0), left), value(left, dt))
    if n > 1:
        if me % 2 == 0:
            comm.send(mine, right)
            got = comm.recv(dt.type(0), left)
        else:
            got = comm.recv(dt.type(0), left)
            comm.send(mine, right)
        same(f"send/recv {dt}", got, value(left, dt))

# Python numbers: a float is one float64, an int one int64; the result is a Python number.
rng = np.random.default_rng(me)
f = float(rng.integers(-50, 50)) / 4
i = int(rng.integers(-(2**40), 2**40))
fs = comm.allgather(f, np.zeros(n, np.float64)).tolist()
is_ = comm.allgather(i, np.zeros(n, np.int64)).tolist()
same("allreduce float", comm.allreduce(f), float(np.sum(fs)))
same("allreduce int max", comm.allreduce(i, op="max"), max(is_))
same("allreduce int async", comm.allreduce(i, async_op=True).wait(30), sum(is_))
same("broadcast float", comm.broadcast(f, root=n - 1), fs[n - 1])
same("reduce int", comm.reduce(i, root=0), sum(is_) if me == 0 else i)
same("sendrecv int", comm.sendrecv(i, (me + 1) % n, 0, (me - 1) % n), is_[(me - 1) % n])
same("scatter float", comm.scatter(np.array(fs) if me == 0 else None, 0.0, root=0), fs[me])

# Bools and complex numbers too: a bool is one bool (sum is *or*, prod is *and*), a complex one
# complex128; the result comes back as the caller's type.
flags = comm.allgather(np.bool_(me % 2 == 0), np.zeros(n, np.bool_)).tolist()
same("allreduce bool", comm.allreduce(me % 2 == 0), any(flags))
same("allreduce bool prod", comm.allreduce(me % 2 == 0, op="prod"), all(flags))
same("allreduce numpy bool max", comm.allreduce(np.bool_(me == 0), op="max"), np.True_)
z = complex(me + 1, -me)
same("allreduce complex", comm.allreduce(z), sum(complex(r + 1, -r) for r in range(n)))
same("scan complex", comm.scan(z), sum(complex(r + 1, -r) for r in range(me + 1)))
same("exscan int", comm.exscan(i), sum(is_[:me]) if me else i)

# Refused with the type named, before any communication (every rank refuses alike).
for bad, exc, words in [(2**70, OverflowError, ["int64"]), (1 + 2j, accord.InvalidArgumentError, ["min", "complex"])]:
    try:
        comm.allreduce(bad, op="min")
    except exc as e:
        if not all(w in str(e) for w in words):
            fail(f"message for {bad!r}", str(e), words)
    else:
        fail(f"allreduce({bad!r})", "no error", exc.__name__)
comm.barrier()
print(f"SCALARS-OK {me}", flush=True)
