"""One rank of the displacements check: run by `accord run -n N python worker_displs.py`.

Every v collective with `displs=` (`send_displs=` / `recv_displs=` for alltoallv), as methods
and as module functions of the default group: blocks in reverse rank order with gaps, which
must keep their sentinel; counts with zeros. Several dtypes, one moved as bytes (datetime64),
whose displacements count its elements, not bytes. Then the argument errors. Prints
`DISPLS-OK <rank>` at the end.
"""

import sys

import numpy as np

import accord

comm = accord.init(timeout=60)
n, me = comm.size, comm.rank
DTYPES = [np.dtype(d) for d in (np.float32, np.int64, np.uint8, np.complex64, "datetime64[ns]")]


def fail(what, got, want):
    print(f"FAIL rank {me} {what}: got {got!r} want {want!r}", flush=True)
    sys.exit(1)


def check(what, got, want):
    if got.dtype != want.dtype or got.shape != want.shape or not np.array_equal(got, want):
        fail(what, got, want)


def values(dt, tag, count):
    """`count` values of `dt` that name `tag` (a tuple of small numbers)."""
    base = 1 + sum(t * 10 ** (2 * i) for i, t in enumerate(tag)) * 16
    ints = np.arange(base, base + count) % 100_000 if dt.kind != "u" else (np.arange(count) + 7 * len(tag) + tag[0]) % 200
    return ints.astype(dt)


def sentinel(dt):
    return np.array(251 if dt.kind == "u" else -3, dtype=np.int64).astype(dt)


def layout(counts):
    """Blocks in reverse rank order, one or two elements apart, one before and two after."""
    displs, at = [0] * len(counts), 1
    for i in reversed(range(len(counts))):
        displs[i] = at
        at += counts[i] + 1 + i % 2
    return displs, at + 1


def spread(dt, length, counts, displs, block):
    buf = np.full(length, sentinel(dt), dt)
    for r, (c, d) in enumerate(zip(counts, displs)):
        buf[d:d + c] = block(r)
    return buf


COUNTS = [[(r * 2 + 1) % 3 for r in range(n)], [r % 2 for r in range(n)], [0] * n]

for dt in DTYPES:
    for k, counts in enumerate(COUNTS):
        displs, length = layout(counts)
        blocks = lambda r, salt: values(dt, (r, salt, k), counts[r])
        for via in ("method", "module"):
            call = (lambda name: getattr(comm, name)) if via == "method" else (lambda name: getattr(accord, name))
            # allgatherv
            out = np.full(length, sentinel(dt), dt)
            assert call("allgatherv")(blocks(me, 1), out, counts, displs=displs) is out
            check(f"allgatherv {dt} {via} {counts}", out, spread(dt, length, counts, displs, lambda r: blocks(r, 1)))
            # gatherv: only the root's out is filled; others pass none
            root = n - 1
            out = np.full(length, sentinel(dt), dt) if me == root else None
            call("gatherv")(blocks(me, 2), out, counts, root=root, displs=displs)
            if me == root:
                check(f"gatherv {dt} {via}", out, spread(dt, length, counts, displs, lambda r: blocks(r, 2)))
            # scatterv: the root's blocks at displs
            src = spread(dt, length, counts, displs, lambda r: blocks(r, 3))
            out = np.full(counts[me], sentinel(dt), dt)
            call("scatterv")(src if me == 0 else None, out, counts, root=0, displs=displs)
            check(f"scatterv {dt} {via}", out, blocks(me, 3))
            # reduce_scatterv: each rank's send blocks at displs; sum over ranks of block `me`
            if dt.kind != "M":
                arr = spread(dt, length, counts, displs, lambda r: values(dt, (me, 4, r), counts[r]))
                before = arr.copy()
                out = np.full(counts[me], sentinel(dt), dt)
                call("reduce_scatterv")(arr, out, counts, op="sum", displs=displs)
                want = sum(values(dt, (s, 4, me), counts[me]).astype(np.complex128 if dt.kind == "c" else np.int64) for s in range(n))
                check(f"reduce_scatterv {dt} {via}", out, np.asarray(want).astype(dt))
                check(f"reduce_scatterv {dt} {via} (send unchanged)", arr, before)
            # alltoallv: rank r sends (r + j + k) % 3 elements to rank j
            sc = lambda r: [(r + j + k) % 3 for j in range(n)]
            rc = [sc(r)[me] for r in range(n)]
            sd, slen = layout(sc(me))
            rd, rlen = layout(rc)
            arr = spread(dt, slen, sc(me), sd, lambda j: values(dt, (me, 5, j), sc(me)[j]))
            out = np.full(rlen, sentinel(dt), dt)
            call("alltoallv")(arr, sc(me), out, rc, send_displs=sd, recv_displs=rd)
            check(f"alltoallv {dt} {via}", out, spread(dt, rlen, rc, rd, lambda r: values(dt, (r, 5, me), rc[r])))
            # only one side with displacements
            out = np.full(sum(rc), sentinel(dt), dt)
            call("alltoallv")(arr, sc(me), out, rc, send_displs=sd)
            check(f"alltoallv send_displs {dt} {via}", out, np.concatenate([values(dt, (r, 5, me), rc[r]) for r in range(n)]))

# Async: the request's result is the output, gaps untouched.
f = np.dtype(np.float32)
counts = [2] * n
displs, length = layout(counts)
out = np.full(length, -3, f)
assert comm.allgatherv(np.full(2, me, f), out, counts, async_op=True, displs=displs).wait(60) is out
check("async allgatherv", out, spread(f, length, counts, displs, lambda r: np.full(2, r, f)))

# Errors, on every rank alike (nothing is sent, so the communicator still works).
mine = np.ones(2, f)
for bad, words in [
    (displs[:-1] if n > 1 else [0, 1], "entries"),
    ([0] * n, "overlap") if n > 1 else ([length - 1], "does not fit"),
    ([length - 1] * n, "does not fit"),
]:
    try:
        comm.allgatherv(mine, np.zeros(length, f), counts, displs=bad)
    except accord.InvalidArgumentError as e:
        if words not in str(e) or "block" not in str(e) and words != "entries":
            fail(f"allgatherv displs={bad}", str(e), words)
    else:
        fail(f"allgatherv displs={bad}", "no error", words)
comm.barrier()
print(f"DISPLS-OK {me}", flush=True)
