"""One rank of the device-attachment check: `accord run -n 2 python gpu_attach_worker.py`.

Each rank uses CUDA device LOCAL_RANK (torch). What attaching the device to a communicator
means from Python: the first call with CUDA arrays attaches it (`gpu_devices` goes from [] to
[LOCAL]); arrays on another device then raise ValueError at once and leave the group usable;
every group attaches its own; nonblocking sends and receives of CUDA arrays are GPU requests;
`abort()` reaches the GPU operations. Prints `ATTACH-OK <rank>` at the end.
"""

import os
import time

import torch

import accord

LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(LOCAL)
DEV = torch.device("cuda", LOCAL)
comm = accord.init(timeout=60)
n, me = comm.size, comm.rank


def fail(msg):
    print(f"FAIL rank {me}: {msg}", flush=True)
    raise SystemExit(1)


def expect_values(name, got, want):
    g = got.cpu().tolist()
    if g != want:
        fail(f"{name}: got {g} want {want}")


# Nothing attached yet: no devices, and nothing to wait for.
if comm.gpu_devices != []:
    fail(f"gpu_devices before any CUDA call is {comm.gpu_devices}")
comm.synchronize()

x = torch.full((4,), float(me + 1), device=DEV)
comm.allreduce(x)
expect_values("first allreduce", x, [n * (n + 1) / 2] * 4)
if comm.gpu_devices != [LOCAL]:
    fail(f"gpu_devices after the first CUDA call is {comm.gpu_devices}, expected [{LOCAL}]")

# One device per communicator: another one is refused at the call, on this rank alone.
if torch.cuda.device_count() > 1:
    other = torch.ones(4, device=torch.device("cuda", (LOCAL + 1) % torch.cuda.device_count()))
    try:
        comm.allreduce(other)
        fail("an allreduce on a second device was accepted")
    except ValueError as e:
        if "GPU" not in str(e):
            fail(f"the second-device error does not name the GPU: {e}")
    x = torch.ones(4, device=DEV)
    comm.allreduce(x)
    expect_values("allreduce after the refused device", x, [float(n)] * 4)

# Nonblocking point-to-point on CUDA arrays: requests over the GPU operations.
if n > 1:
    buf = torch.full((3,), 7.0, device=DEV) if me == 0 else torch.zeros(3, device=DEV)
    if me == 0:
        req = comm.send(buf, 1, async_op=True)
    elif me == 1:
        req = comm.recv(buf, 0, async_op=True)
    if me < 2:
        if not req.is_gpu:
            fail("a nonblocking send/recv of CUDA arrays is not a GPU request")
        got = req.wait(timeout=30)
        if me == 1 and got is not buf:
            fail("Request.wait of a recv must return its array")
        expect_values("async send/recv", buf, [7.0] * 3)

# A group attaches its own device on its first CUDA call.
sub = comm.split(0)
if sub.gpu_devices != []:
    fail(f"a new group has gpu_devices {sub.gpu_devices}")
y = torch.ones(2, device=DEV)
sub.allreduce(y)
sub.synchronize()
expect_values("group allreduce", y, [float(n)] * 2)
if sub.gpu_devices != [LOCAL]:
    fail(f"the group's gpu_devices is {sub.gpu_devices}")

# abort() stops the GPU operations too: a later CUDA call (or synchronize) raises.
comm.barrier()
comm.abort("attachment check done")
deadline = time.monotonic() + 10
while True:
    try:
        comm.allreduce(torch.ones(4, device=DEV))
        comm.synchronize()
    except accord.AccordError:
        break
    if time.monotonic() > deadline:
        fail("GPU calls still succeed 10 s after abort()")
    time.sleep(0.05)
print(f"ATTACH-OK {me}", flush=True)
