"""One rank of the bad-input check (`accord run -n N python worker_errors.py`): local argument
errors are raised before any communication; mismatched sizes across ranks end in an error naming
both calls on every rank (DesyncError where it is seen, AbortedError on the ranks it reaches)."""

import numpy as np

import accord

comm = accord.init(timeout=30)
me = comm.rank


def expect(exc, fn, words):
    try:
        fn()
    except exc as e:
        msg = str(e)
        assert all(w in msg for w in words), (exc, msg)
        return e
    raise AssertionError(f"expected {exc.__name__}")


# Types numpy has but accord does not move as bytes, and cannot be reduced (named as numpy
# names them); Python objects cannot be sent as memory at all.
for odd in (np.zeros(4, np.longdouble), np.zeros(4, "datetime64[ns]"), np.zeros(4, "U3")):
    expect(TypeError, lambda: comm.allreduce(odd), ["dtype", odd.dtype.name, "cannot reduce"])
    expect(TypeError, lambda: comm.allgather(odd, np.zeros(4 * comm.size, np.float64)), ["dtype", odd.dtype.name])
expect(TypeError, lambda: comm.broadcast(np.array([None, 1], dtype=object)), ["object", "broadcast_object"])
if comm.size > 1:
    # Moved as bytes, an alltoall's blocks must still be whole elements.
    odd = np.zeros(comm.size + 1, "datetime64[ns]")
    expect(accord.InvalidArgumentError, lambda: comm.alltoall(odd, np.zeros_like(odd)), ["not a multiple"])
# Complex numbers have no order and no bits; prefix averages have no one divisor.
expect(accord.InvalidArgumentError, lambda: comm.allreduce(np.zeros(4, np.complex64), op="max"), ["max", "complex"])
expect(accord.InvalidArgumentError, lambda: comm.allreduce(np.zeros(4, np.complex128), op="bxor"), ["bxor"])
expect(accord.InvalidArgumentError, lambda: comm.allreduce(np.zeros(4, np.bool_), op="avg"), ["avg"])
expect(accord.InvalidArgumentError, lambda: comm.scan(np.zeros(4, np.float32), op="avg"), ["scan", "avg"])
expect(ValueError, lambda: comm.allreduce(np.zeros(8, np.float32)[::2]), ["contiguous"])
expect(ValueError, lambda: comm.allreduce(np.zeros((4, 4), np.float32).T), ["contiguous"])
ro = np.zeros(4, np.float32)
ro.flags.writeable = False
expect(ValueError, lambda: comm.allreduce(ro), ["read-only"])
expect(ValueError, lambda: comm.allreduce(np.ones(4, np.float32), out=ro), ["read-only"])
comm.allreduce(ro, out=np.zeros(4, np.float32))  # read-only input is fine
expect(TypeError, lambda: comm.allreduce(np.ones(4, np.float32), out=np.zeros(4, np.float64)), ["dtype"])
expect(ValueError, lambda: comm.allreduce(np.ones(4, np.float32), op="median"), ["median"])
expect(TypeError, lambda: comm.allreduce([1, 2, 3]), ["array"])
e = expect(accord.InvalidArgumentError, lambda: comm.allreduce(np.ones(4, np.float32), op="band"), ["band"])
assert isinstance(e, ValueError) and isinstance(e, accord.AccordError)
expect(accord.InvalidArgumentError, lambda: comm.allgather(np.ones(4, np.float32), np.zeros(3, np.float32)), [])


class FakeGpuArray:
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, False), "version": 3}


e = expect(accord.UnsupportedError, lambda: comm.allreduce(FakeGpuArray()), ["GPU"])
assert isinstance(e, TypeError)
comm.barrier()  # still healthy after local argument errors

if comm.size > 1:
    # The rank that sees the mismatch raises DesyncError; it then aborts the world, so a rank
    # still waiting raises AbortedError whose message carries the same two calls.
    calls = ["f32 x 4, sum", "f32 x 5, sum"]
    e = expect(accord.AccordError, lambda: comm.allreduce(np.ones(4 + me, np.float32)), calls)
    assert isinstance(e, (accord.DesyncError, accord.AbortedError)), type(e)
    assert "desync" in str(e), str(e)
    if isinstance(e, accord.DesyncError):
        assert e.mine and e.theirs and e.peer != me and e.seq >= 0, vars(e)
print(f"ERRORS-OK {me}", flush=True)
