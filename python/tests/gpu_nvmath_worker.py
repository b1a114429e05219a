"""One rank of gpu_frameworks_check.sh: nvmath-python's distributed runtime started on a GPU
with Accord's process group (``accord.nvmath.ProcessGroup``), one GPU per rank, (nvmath
broadcasts its NCCL unique id through it), checked and finalized."""

import inspect

import numpy as np

import accord
import accord.nvmath
import nvmath.distributed

comm = accord.init()
import cupy  # noqa: E402  (after init: the launcher's environment picks nothing GPU-wise)

ngpu = cupy.cuda.runtime.getDeviceCount()
device = comm.rank % ngpu
pg = accord.nvmath.ProcessGroup(comm)
kwargs = {}
if "backends" in inspect.signature(nvmath.distributed.initialize).parameters:
    # nvmath >= 0.6 names its libraries' transports; NCCL (nccl4py) is the one carried.
    kwargs["backends"] = ["nccl"]
nvmath.distributed.initialize(device, pg, **kwargs)
ctx = nvmath.distributed.get_context()
assert ctx is not None and ctx.device_id == device, ctx
assert ctx.process_group is pg, ctx.process_group
# What nvmath asks of the group, on its device's arrays' host mirrors.
x = np.array([comm.rank + 1.0])
pg.allreduce_buffer(x, op=0)  # ReductionOp.SUM
assert x[0] == comm.size * (comm.size + 1) / 2, x
# With the NCCL backend, nvmath made its NCCL communicator from a unique id it broadcast
# through Accord's group: it exists on every rank.
assert "backends" not in kwargs or ctx.nccl_comm is not None, ctx
nvmath.distributed.finalize()
comm.close()
print(f"GPU-NVMATH-OK {comm.rank}", flush=True)
