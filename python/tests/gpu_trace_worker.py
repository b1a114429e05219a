"""Rank program for test_gpu.py's timeline test: GPU collectives under ACCORD_TRACE.

argv[1]: torch or cupy. Checks this rank's flight record (device calls seen finished once the
GPU is synchronized), then closes the communicator, which writes the timeline.
"""

import os
import sys

import accord

framework = sys.argv[1]
comm = accord.init()
me = comm.rank
if framework == "torch":
    import torch

    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    x = torch.ones(1 << 16, device="cuda")
    sync = torch.cuda.synchronize
else:
    import cupy

    cupy.cuda.Device(int(os.environ.get("LOCAL_RANK", "0")) % cupy.cuda.runtime.getDeviceCount()).use()
    x = cupy.ones(1 << 16, dtype=cupy.float32)
    sync = cupy.cuda.runtime.deviceSynchronize
for _ in range(4):
    comm.allreduce(x)
comm.broadcast(x, root=0)
sync()
assert float(x[0]) == comm.size**4, float(x[0])
rec = comm.flight_record()
dev = [r for r in rec["records"] if r["lane"] == "device"]
assert [r["op"] for r in dev] == ["allreduce"] * 4 + ["broadcast"], dev
assert [r["seq"] for r in dev] == [1, 2, 3, 4, 5], dev
assert all(r["state"] == "completed" and r["engine"].startswith("the GPU") for r in dev), dev
assert comm.metrics()["device_ops"] == 5
comm.close()
print(f"GPU-TRACE-OK {framework} {me}")
