"""One rank of test_nvmath_process_group: accord.nvmath.ProcessGroup against nvmath-python's
ProcessGroup protocol (nvmath's own ReductionOp when nvmath is installed, else an IntEnum of
the same values), on host arrays."""

import enum

import numpy as np

import accord
import accord.nvmath

try:
    from nvmath.distributed.process_group import ProcessGroup as NvmathBase
    from nvmath.distributed.process_group import ReductionOp
except Exception:
    NvmathBase = None

    class ReductionOp(enum.IntEnum):  # nvmath's values
        SUM = 0
        MIN = 1
        MAX = 2


comm = accord.init()
pg = accord.nvmath.ProcessGroup(comm)
if NvmathBase is not None:
    assert isinstance(pg, NvmathBase)
r, n = pg.rank, pg.nranks
assert (r, n) == (comm.rank, comm.size)

a = np.arange(5, dtype=np.int64) * (r + 1)
pg.broadcast_buffer(a, root=n - 1)
assert a.tolist() == [i * n for i in range(5)], a

for op, fold in ((ReductionOp.SUM, sum), (ReductionOp.MIN, min), (ReductionOp.MAX, max)):
    x = np.array([r + 1.5, -r], np.float64)
    pg.allreduce_buffer(x, op=op)
    assert x.tolist() == [fold(q + 1.5 for q in range(n)), fold(-q for q in range(n))], (op, x)

# Objects: folded in rank order, the same on every rank.
assert pg.allreduce_object([r], op=lambda p, q: p + q) == list(range(n))
assert pg.allreduce_object({"r": r}, op=lambda p, q: p if p["r"] > q["r"] else q) == {"r": n - 1}
try:
    pg.allreduce_buffer(np.zeros(1), op="avg")
except ValueError as e:
    assert "ReductionOp" in str(e)
else:
    raise AssertionError("an op nvmath does not have was accepted")
print(f"NVMATH-PG-OK {r} ({'nvmath-python' if NvmathBase is not None else 'the documented protocol'})", flush=True)
