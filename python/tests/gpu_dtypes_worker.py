"""One rank of the GPU element-type check: `accord run -n N python gpu_dtypes_worker.py torch|cupy`.

bool, int16, complex64 and complex128 arrays on the GPU (types NCCL lacks, re-expressed as bytes
or real components) and scan/exscan (built on NCCL's reduce-scatter), compared with numpy.
Then closing releases the device engine. Prints `GPU-DTYPES-OK <framework> <rank>` at the end.
"""

import os
import sys

import numpy as np

import accord

FW = sys.argv[1]
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
comm = accord.init(timeout=60)
n, me = comm.size, comm.rank

if FW == "torch":
    import torch

    torch.cuda.set_device(LOCAL)

    def dev(a):
        return torch.from_numpy(a).cuda()

    def host(x):
        return x.cpu().numpy()

else:
    import cupy as cp

    cp.cuda.Device(LOCAL).use()

    def dev(a):
        return cp.asarray(a)

    def host(x):
        return cp.asnumpy(x)


def data(rank, dt, count=7):
    rng = np.random.default_rng(100 + rank)
    if dt == np.bool_:
        return rng.integers(0, 2, count).astype(dt)
    x = rng.integers(-3, 4, count)
    if np.dtype(dt).kind == "c":
        return (x + 1j * rng.integers(-3, 4, count)).astype(dt)
    return x.astype(dt)


def check(what, got, want):
    got = host(got)
    if got.dtype != np.asarray(want).dtype or not np.array_equal(got, want):
        print(f"FAIL rank {me} {FW} {what}: got {got} want {want}", flush=True)
        sys.exit(1)


alls = {dt: [data(r, dt) for r in range(n)] for dt in (np.bool_, np.int16, np.complex64, np.complex128)}
for dt, ins in alls.items():
    name = np.dtype(dt).name
    b = dev(ins[me])
    comm.broadcast(b, root=n - 1)
    check(f"broadcast {name}", b, ins[n - 1])
    g = dev(np.zeros(7 * n, dt))
    comm.allgather(dev(ins[me]), g)
    check(f"allgather {name}", g, np.concatenate(ins))
    if dt == np.int16:
        try:
            comm.allreduce(dev(ins[me]))
        except accord.InvalidArgumentError as e:
            assert "int16" in str(e) or "i16" in str(e), e
        else:
            print(f"FAIL rank {me}: an int16 reduction on the GPU was accepted", flush=True)
            sys.exit(1)
        continue
    ops = ["sum", "max"] if dt == np.bool_ else ["sum", "avg"]
    for op in ops:
        x = dev(ins[me])
        comm.allreduce(x, op=op)
        stack = np.stack(ins)
        want = {"sum": stack.any(0) if dt == np.bool_ else stack.sum(0), "max": stack.any(0),
                "avg": stack.mean(0).astype(dt)}[op]
        check(f"allreduce {op} {name}", x, want)
    # Prefix sums of the first ranks (an exscan leaves rank 0's array as it was).
    x = dev(ins[me])
    comm.scan(x)
    check(f"scan {name}", x, np.stack(ins[:me + 1]).any(0) if dt == np.bool_ else np.stack(ins[:me + 1]).sum(0))
    x = dev(ins[me])
    comm.exscan(x)
    want = ins[me] if me == 0 else (np.stack(ins[:me]).any(0) if dt == np.bool_ else np.stack(ins[:me]).sum(0))
    check(f"exscan {name}", x, want)

# Scan of a real type with every operator NCCL has (their identities pad the other blocks).
for op, ref in [("sum", np.sum), ("prod", np.prod), ("min", np.min), ("max", np.max)]:
    for dt in (np.float32, np.float64, np.int64, np.uint8, np.float16):
        ins = [data(r, dt) + (1 if op == "prod" else 0) for r in range(n)]
        x = dev(ins[me].astype(dt))
        comm.scan(x, op=op)
        check(f"scan {op} {np.dtype(dt).name}", x, ref(np.stack(ins[:me + 1]), 0).astype(dt))
comm.synchronize()

# Closing releases the device engine at once (NCCL's communicator and its buffers), not when
# the last reference goes; later calls say it was closed.
def free_bytes():
    return torch.cuda.mem_get_info()[0] if FW == "torch" else cp.cuda.runtime.memGetInfo()[0]


comm.barrier()
before = free_bytes()
keep = comm  # a second reference: closing must not wait for it to go
comm.close()
released = free_bytes() - before
if n > 1 and released <= 0:
    print(f"FAIL rank {me} {FW}: close released no device memory ({released} bytes)", flush=True)
    sys.exit(1)
try:
    keep.allreduce(dev(np.ones(3, np.float32)))
except accord.InvalidArgumentError as e:
    assert "closed" in str(e), e
else:
    print(f"FAIL rank {me} {FW}: a closed communicator ran a GPU call", flush=True)
    sys.exit(1)
print(f"GPU-DTYPES-OK {FW} {me} (close released {released >> 20} MiB)", flush=True)
