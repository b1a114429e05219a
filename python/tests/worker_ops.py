"""One rank of the all-operations check: run by `accord run -n N python worker_ops.py`.

Every rank derives every rank's random input from a shared seed, so each can compute the numpy
reference of every collective and compare. Values are small integers, so sums and products are
exact in every dtype (averages are compared with a tolerance). Prints `OK <rank>` at the end.
"""

import sys

import numpy as np

import accord

try:
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:
    BF16 = None

comm = accord.init(timeout=60)
n, me = comm.size, comm.rank
DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.uint32, np.uint64,
          np.bool_, np.int16, np.uint16, np.complex64, np.complex128]
DTYPES = [np.dtype(d) for d in DTYPES] + ([BF16] if BF16 is not None else [])
COUNT = 7  # elements per rank: odd, to exercise uneven chunking


def data(rank, dtype, count=COUNT, salt=0):
    rng = np.random.default_rng(1000 * rank + 17 * salt + count)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=count).astype(dtype)
    lo = 0 if dtype.kind == "u" else -2
    if dtype.kind == "c":
        return (rng.integers(lo, 4, size=count) + 1j * rng.integers(lo, 4, size=count)).astype(dtype)
    return rng.integers(lo, 4, size=count).astype(dtype)


def is_float(d):
    return d.kind in "fc" or d == BF16


def check(name, got, want, dtype):
    wide = np.complex128 if dtype.kind == "c" else np.float64
    g = np.asarray(got).astype(wide)
    w = np.asarray(want).astype(wide)
    tol = 0.05 * np.maximum(1, np.abs(w)) if is_float(dtype) else 0
    if g.shape != w.shape or not np.all(np.abs(g - w) <= tol):
        print(f"FAIL rank {me} {name} {dtype}: got {g} want {w}", flush=True)
        sys.exit(1)


LOGIC = {"sum": np.logical_or, "max": np.logical_or, "bor": np.logical_or, "prod": np.logical_and,
         "min": np.logical_and, "band": np.logical_and, "bxor": np.logical_xor}


def ref_reduce(op, arrays, dtype):
    if dtype.kind == "b":
        return LOGIC[op].reduce(np.stack(arrays), 0)
    wide = np.complex128 if dtype.kind == "c" else np.float64
    a = np.stack([x.astype(wide) if is_float(dtype) else x for x in arrays])
    if op == "sum":
        r = a.sum(0)
    elif op == "prod":
        r = a.prod(0)
    elif op == "min":
        r = a.min(0)
    elif op == "max":
        r = a.max(0)
    elif op == "avg":
        r = a.mean(0)
    elif op == "band":
        r = np.bitwise_and.reduce(a, 0)
    elif op == "bor":
        r = np.bitwise_or.reduce(a, 0)
    elif op == "bxor":
        r = np.bitwise_xor.reduce(a, 0)
    return r.astype(dtype) if not is_float(dtype) else r


def movement(dt, data, check):
    """Every data-movement operation on `dt`, inputs from `data`, results compared by `check`."""
    mine = data(me, dt)
    alls = [data(r, dt) for r in range(n)]
    counts = [r + 1 for r in range(n)]
    off = sum(counts[:me])
    for root in {0, n - 1}:
        x = data(root, dt) if me == root else np.zeros(COUNT, dt)
        comm.broadcast(x, root=root)
        check("broadcast", x, data(root, dt), dt)
    out = np.zeros(n * COUNT, dt)
    comm.allgather(mine, out)
    check("allgather", out, np.concatenate(alls), dt)
    vdata = [data(r, dt, r + 1, 3) for r in range(n)]
    out = np.zeros(sum(counts), dt)
    comm.allgatherv(vdata[me], out, counts)
    check("allgatherv", out, np.concatenate(vdata), dt)
    root = n - 1
    out = np.zeros(n * COUNT, dt) if me == root else None
    comm.gather(mine, out, root=root)
    if me == root:
        check("gather", out, np.concatenate(alls), dt)
    out = np.zeros(sum(counts), dt) if me == root else None
    comm.gatherv(vdata[me], out, counts, root=root)
    if me == root:
        check("gatherv", out, np.concatenate(vdata), dt)
    src = data(root, dt, n * COUNT, 4)
    out = np.zeros(COUNT, dt)
    comm.scatter(src if me == root else None, out, root=root)
    check("scatter", out, src[me * COUNT:(me + 1) * COUNT], dt)
    src = data(root, dt, sum(counts), 5)
    out = np.zeros(counts[me], dt)
    comm.scatterv(src if me == root else None, out, counts, root=root)
    check("scatterv", out, src[off:off + counts[me]], dt)
    # alltoall: rank r's block j is data(r, ..., salt=6)[j*COUNT:(j+1)*COUNT]
    a2a = [data(r, dt, n * COUNT, 6) for r in range(n)]
    out = np.zeros(n * COUNT, dt)
    comm.alltoall(a2a[me], out)
    check("alltoall", out, np.concatenate([a2a[r][me * COUNT:(me + 1) * COUNT] for r in range(n)]), dt)
    # alltoallv: rank r sends (r + j) % 3 + 1 elements to rank j
    sc = lambda r: [(r + j) % 3 + 1 for j in range(n)]
    a2av = [data(r, dt, sum(sc(r)), 7) for r in range(n)]
    rc = [sc(r)[me] for r in range(n)]
    out = np.zeros(sum(rc), dt)
    comm.alltoallv(a2av[me], sc(me), out, rc)
    want = np.concatenate([a2av[r][sum(sc(r)[:me]):sum(sc(r)[:me + 1])] for r in range(n)])
    check("alltoallv", out, want, dt)
    # point to point around the ring
    right, left = (me + 1) % n, (me - 1) % n
    out = np.zeros(COUNT, dt)
    comm.sendrecv(mine, right, out, left, tag=3)
    check("sendrecv", out, alls[left], dt)
    if n > 1:
        if me % 2 == 0:
            comm.send(mine, right, tag=5)
            comm.recv(out, left, tag=5)
        else:
            comm.recv(out, left, tag=5)
            comm.send(mine, right, tag=5)
        check("send/recv", out, alls[left], dt)


for dt in DTYPES:
    mine = data(me, dt)
    alls = [data(r, dt) for r in range(n)]
    ops = ["sum", "prod"] + (["min", "max"] if dt.kind != "c" else [])
    ops += ["avg"] if is_float(dt) else ["band", "bor", "bxor"]
    for op in ops:
        # allreduce in place: the same array object and memory, changed.
        x = mine.copy()
        ptr = x.__array_interface__["data"][0]
        y = comm.allreduce(x, op=op)
        assert y is x and x.__array_interface__["data"][0] == ptr
        check(f"allreduce {op} in place", x, ref_reduce(op, alls, dt), dt)
        out = np.zeros_like(mine)
        r = comm.allreduce(mine, op=accord.ReduceOp(op), out=out)
        assert r is out
        check(f"allreduce {op} out", out, ref_reduce(op, alls, dt), dt)
        check("allreduce input untouched", mine, data(me, dt), dt)
        for root in {0, n - 1}:
            x = mine.copy()
            comm.reduce(x, op=op, root=root)
            check(f"reduce {op} root {root}", x, ref_reduce(op, alls, dt) if me == root else mine, dt)
            out = np.zeros_like(mine)
            comm.reduce(mine, op=op, root=root, out=out if me == root else None)
            if me == root:
                check(f"reduce {op} out", out, ref_reduce(op, alls, dt), dt)
        # reduce_scatter: input n*COUNT, output COUNT
        big = [data(r, dt, n * COUNT, 1) for r in range(n)]
        out = np.zeros(COUNT, dt)
        comm.reduce_scatter(big[me], out, op=op)
        check(f"reduce_scatter {op}", out, ref_reduce(op, big, dt)[me * COUNT:(me + 1) * COUNT], dt)
        if op != "avg":
            # Prefix reductions: ranks 0..me (scan) or 0..me-1 (exscan; rank 0's output untouched).
            x = mine.copy()
            assert comm.scan(x, op=op) is x
            check(f"scan {op} in place", x, ref_reduce(op, alls[:me + 1], dt), dt)
            out = np.zeros_like(mine)
            comm.exscan(mine, op=op, out=out)
            check(f"exscan {op}", out, ref_reduce(op, alls[:me], dt) if me else np.zeros_like(mine), dt)
            x = mine.copy()
            accord.exscan(x, op=op, group=comm)
            check(f"exscan {op} in place", x, ref_reduce(op, alls[:me], dt) if me else mine, dt)
    # reduce_scatterv: rank r gets r+1 elements
    counts = [r + 1 for r in range(n)]
    big = [data(r, dt, sum(counts), 2) for r in range(n)]
    out = np.zeros(counts[me], dt)
    comm.reduce_scatterv(big[me], out, counts, op="sum")
    off = sum(counts[:me])
    check("reduce_scatterv", out, ref_reduce("sum", big, dt)[off:off + counts[me]], dt)
    movement(dt, data, check)
    comm.barrier()

# Dtypes accord has no type for move as their bytes: every data-movement operation, counts
# in the caller's elements, compared exactly.
RAW = [np.dtype("datetime64[ns]"), np.dtype("timedelta64[s]"), np.dtype(np.longdouble), np.dtype("U3"),
       np.dtype([("id", "<i4"), ("w", "<f8")])]


def raw_data(rank, dt, count=COUNT, salt=0):
    ints = np.random.default_rng(5000 + 1000 * rank + salt + count).integers(0, 1000, count)
    if dt.kind in "Mm":
        return ints.astype(dt)
    if dt.kind == "U":
        return np.array([f"{i:03d}"[:3] for i in ints], dt)
    if dt.names:
        out = np.zeros(count, dt)
        out["id"], out["w"] = ints, ints / 8
        return out
    return ints.astype(dt) / 3


def same_raw(name, got, want, dt):
    if got.dtype != want.dtype or not np.array_equal(got, want):
        print(f"FAIL rank {me} {name} {dt}: got {got} want {want}", flush=True)
        sys.exit(1)


for dt in RAW:
    movement(dt, raw_data, same_raw)

# Nonblocking: several requests in flight, completed in reverse order.
f = np.dtype(np.float32)
xs = [data(me, f, 1000, s).copy() for s in range(4)]
reqs = [comm.allreduce(x, async_op=True) for x in xs]
reqs.append(comm.barrier(async_op=True))
for r in reversed(reqs):
    r.wait(timeout=60)
    assert r.test()
for s, x in enumerate(xs):
    check("iallreduce", x, ref_reduce("sum", [data(r, f, 1000, s) for r in range(n)], f), f)
out = np.zeros(n * COUNT, f)
assert comm.allgather(data(me, f), out, async_op=True).wait(60) is out
check("iallgather", out, np.concatenate([data(r, f) for r in range(n)]), f)

# Several messages with one tag in flight: nonblocking sends of different sizes arrive whole and
# in the order they were posted; nonblocking receives match in posting order.
if n > 1:
    right, left = (me + 1) % n, (me - 1) % n
    big = np.arange(400_000, dtype=np.float64) + me  # several frames each
    small = np.full(5, me, np.int32)
    sends = [comm.send(big, right, tag=11, async_op=True), comm.send(small, right, tag=11, async_op=True)]
    got_big, got_small = np.zeros_like(big), np.zeros_like(small)
    recvs = [comm.recv(got_big, left, tag=11, async_op=True), comm.recv(got_small, left, tag=11, async_op=True)]
    for r in sends + recvs:
        r.wait(timeout=60)
    check("isend/irecv order (large)", got_big, np.arange(400_000, dtype=np.float64) + left, np.dtype(np.float64))
    check("isend/irecv order (small)", got_small, np.full(5, left, np.int32), np.dtype(np.int32))
    comm.barrier()

# Module-level functions use the default group.
x = np.ones(3, np.int64)
accord.allreduce(x)
check("accord.allreduce", x, np.full(3, n), np.dtype(np.int64))
assert accord.get_rank() == me and accord.get_world_size() == n

# Groups: split by parity, reversed order by key; subgroup of the even ranks.
sub = comm.split(me % 2, key=-me)
members = [r for r in range(n) if r % 2 == me % 2][::-1]
assert sub.size == len(members) and sub.rank == members.index(me), (sub.size, sub.rank)
x = np.array([me], np.int64)
sub.allreduce(x)
check("split allreduce", x, [sum(members)], np.dtype(np.int64))
evens = list(range(0, n, 2))
g = comm.subgroup(evens)
assert (g is None) == (me % 2 == 1)
if g is not None:
    x = np.array([me], np.int64)
    g.allreduce(x)
    check("subgroup allreduce", x, [sum(evens)], np.dtype(np.int64))
comm.barrier()
print(f"OK {me} of {n} dtypes={len(DTYPES)}", flush=True)
