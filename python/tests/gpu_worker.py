"""One rank of the GPU check: `accord run -n N python gpu_worker.py torch|cupy`.

One process per GPU (LOCAL_RANK picks the device). Every operation of the Communicator runs on
CUDA arrays of the given framework in float16, bfloat16 (where the framework has it) and
float32, and is compared with a numpy reference computed from every rank's (shared-seed) input.
Results are read back on the current stream right after the call, so they also check that the
operation is ordered on the framework's current stream. Then: a kernel on a non-default stream
writing the input just before the call, async requests, argument errors, a desync. Prints
`GPU-OK <framework> <rank>` at the end.
"""

import os
import sys
import time

import numpy as np

import accord
from accord import _arrays

FW = sys.argv[1]
LOCAL = int(os.environ.get("LOCAL_RANK", "0"))
comm = accord.init(timeout=60)
n, me = comm.size, comm.rank
COUNT = 5  # elements per rank: odd


def fail(msg):
    print(f"FAIL rank {me} {FW}: {msg}", flush=True)
    sys.exit(1)


if FW == "torch":
    import torch

    torch.cuda.set_device(LOCAL)
    DEV = torch.device("cuda", LOCAL)
    DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

    def to_dev(a, dt):
        return torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(DEV).to(dt)

    def zeros(k, dt):
        return torch.zeros(k, dtype=dt, device=DEV)

    def to_host(x):
        return x.float().cpu().numpy()  # ordered on the current stream

    def side_stream():
        return torch.cuda.Stream(DEV)

    def on(s):
        return torch.cuda.stream(s)

    def spin(ms):
        torch.cuda._sleep(int(ms * 2_000_000))  # about `ms` at ~2 GHz

    def fill(x, v):
        x.fill_(v)

    def int_array(k):
        return torch.ones(k, dtype=torch.int32, device=DEV)

    def current_stream_sync():
        torch.cuda.current_stream(DEV).synchronize()

elif FW == "cupy":
    import cupy as cp

    cp.cuda.Device(LOCAL).use()
    DTYPES = {"float16": cp.float16, "float32": cp.float32}
    try:  # bfloat16 where this CuPy has it
        import ml_dtypes

        cp.zeros(2, dtype=ml_dtypes.bfloat16).astype(cp.float32)
        DTYPES["bfloat16"] = ml_dtypes.bfloat16
    except Exception as e:  # noqa: BLE001
        print(f"note rank {me}: cupy without bfloat16 ({type(e).__name__}), not tested", flush=True)

    def to_dev(a, dt):
        return cp.asarray(np.ascontiguousarray(a, np.float32)).astype(dt)

    def zeros(k, dt):
        return cp.zeros(k, dtype=dt)

    def to_host(x):
        return cp.asnumpy(x.astype(cp.float32))  # ordered on the current stream

    def side_stream():
        return cp.cuda.Stream(non_blocking=True)

    def on(s):
        return s

    _SPIN = cp.RawKernel(
        r"""extern "C" __global__ void spin(long long cycles) {
            long long t = clock64(); while (clock64() - t < cycles) {} }""",
        "spin",
    )

    def spin(ms):
        _SPIN((1,), (1,), (np.int64(ms * 2_000_000),))

    def fill(x, v):
        x.fill(v)

    def int_array(k):
        return cp.ones(k, dtype=cp.int32)

    def current_stream_sync():
        cp.cuda.get_current_stream().synchronize()

else:
    fail(f"unknown framework {FW}")


def data(rank, k=COUNT, salt=0):
    rng = np.random.default_rng(1000 * rank + 17 * salt + k)
    return rng.integers(-2, 4, size=k).astype(np.float32)


def check(name, got, want):
    g = to_host(got)
    w = np.asarray(want, np.float64)
    if g.shape != w.shape or not np.all(np.abs(g - w) <= 0.05 * np.maximum(1, np.abs(w))):
        fail(f"{name}: got {g} want {w}")


def run_ops(dname, dt):
    root = n - 1
    ins = [data(r) for r in range(n)]
    tag = f"{dname}"
    # allreduce, in place and out of place, several ops
    for op, ref in [("sum", np.sum), ("max", np.max), ("min", np.min), ("avg", np.mean)]:
        x = to_dev(ins[me], dt)
        if comm.allreduce(x, op=op) is not x:
            fail("allreduce must return its array")
        check(f"allreduce {op} {tag}", x, ref(np.stack(ins), 0))
    x, out = to_dev(ins[me], dt), zeros(COUNT, dt)
    comm.allreduce(x, out=out)
    check(f"allreduce out {tag}", out, np.sum(ins, 0))
    check(f"allreduce input kept {tag}", x, ins[me])
    # broadcast
    x = to_dev(ins[me], dt)
    comm.broadcast(x, root=root)
    check(f"broadcast {tag}", x, ins[root])
    # reduce, in place at the root and with out
    x = to_dev(ins[me], dt)
    comm.reduce(x, root=root)
    check(f"reduce {tag}", x, np.sum(ins, 0) if me == root else ins[me])
    x, out = to_dev(ins[me], dt), zeros(COUNT, dt)
    comm.reduce(x, op="max", root=0, out=out)
    if me == 0:
        check(f"reduce out {tag}", out, np.max(ins, 0))
    # allgather(v)
    out = zeros(n * COUNT, dt)
    comm.allgather(to_dev(ins[me], dt), out)
    check(f"allgather {tag}", out, np.concatenate(ins))
    counts = [r + 1 for r in range(n)]
    vins = [data(r, counts[r], 1) for r in range(n)]
    out = zeros(sum(counts), dt)
    comm.allgatherv(to_dev(vins[me], dt), out, counts)
    check(f"allgatherv {tag}", out, np.concatenate(vins))
    # gather(v)
    out = zeros(n * COUNT, dt) if me == root else None
    comm.gather(to_dev(ins[me], dt), out, root=root)
    if me == root:
        check(f"gather {tag}", out, np.concatenate(ins))
    out = zeros(sum(counts), dt) if me == root else None
    comm.gatherv(to_dev(vins[me], dt), out, counts=counts, root=root)
    if me == root:
        check(f"gatherv {tag}", out, np.concatenate(vins))
    # scatter(v)
    big = data(root, n * COUNT, 2)
    out = zeros(COUNT, dt)
    comm.scatter(to_dev(big, dt) if me == root else None, out, root=root)
    check(f"scatter {tag}", out, big[me * COUNT:(me + 1) * COUNT])
    vbig = data(root, sum(counts), 3)
    out = zeros(counts[me], dt)
    comm.scatterv(to_dev(vbig, dt) if me == root else None, out, counts, root=root)
    off = sum(counts[:me])
    check(f"scatterv {tag}", out, vbig[off:off + counts[me]])
    # reduce_scatter(v)
    rins = [data(r, n * COUNT, 4) for r in range(n)]
    out = zeros(COUNT, dt)
    comm.reduce_scatter(to_dev(rins[me], dt), out)
    check(f"reduce_scatter {tag}", out, np.sum(rins, 0)[me * COUNT:(me + 1) * COUNT])
    rvins = [data(r, sum(counts), 5) for r in range(n)]
    out = zeros(counts[me], dt)
    comm.reduce_scatterv(to_dev(rvins[me], dt), out, counts)
    check(f"reduce_scatterv {tag}", out, np.sum(rvins, 0)[off:off + counts[me]])
    # alltoall(v)
    ains = [data(r, n * COUNT, 6) for r in range(n)]
    out = zeros(n * COUNT, dt)
    comm.alltoall(to_dev(ains[me], dt), out)
    check(f"alltoall {tag}", out, np.concatenate([ains[r][me * COUNT:(me + 1) * COUNT] for r in range(n)]))
    # rank r sends (j + 1) elements to rank j; receives (me + 1) from everyone
    sc = [j + 1 for j in range(n)]
    rc = [me + 1] * n
    avins = [data(r, sum(sc), 7) for r in range(n)]
    out = zeros(sum(rc), dt)
    comm.alltoallv(to_dev(avins[me], dt), sc, out, rc)
    want = [avins[r][sum(sc[:me]):sum(sc[:me]) + me + 1] for r in range(n)]
    check(f"alltoallv {tag}", out, np.concatenate(want))
    # point to point: a ring with sendrecv, then send/recv pairs
    nxt, prv = (me + 1) % n, (me - 1) % n
    out = zeros(COUNT, dt)
    comm.sendrecv(to_dev(ins[me], dt), nxt, out, prv)
    check(f"sendrecv {tag}", out, ins[prv])
    if n > 1:
        if me == 0:
            comm.send(to_dev(ins[0], dt), 1)
        elif me == 1:
            out = zeros(COUNT, dt)
            if comm.recv(out, 0) is not out:
                fail("recv must return its array")
            check(f"send/recv {tag}", out, ins[0])


for dname, dt in DTYPES.items():
    run_ops(dname, dt)
if comm.gpu_devices != [LOCAL]:
    fail(f"gpu_devices is {comm.gpu_devices}, expected [{LOCAL}]")

# Stream ordering: a slow kernel, then a write of the input, both on a non-default stream that
# is current during the call. Run on any other stream, the allreduce would read the old values.
dt = DTYPES["float32"]
s = side_stream()
with on(s):
    x = zeros(1 << 16, dt)
    current_stream_sync()
    spin(300)
    fill(x, me + 1)
    t0 = time.perf_counter()
    comm.allreduce(x)
    took = time.perf_counter() - t0
    # The blocking call returns once enqueued: well before the 300 ms kernel ends.
    if took > 0.2:
        fail(f"a blocking GPU allreduce took {took * 1000:.0f} ms to return behind a 300 ms kernel")
    want = n * (n + 1) / 2
    check("stream-ordered allreduce", x[:4], [want] * 4)
print(f"stream ordering ok rank {me}: call returned after {took * 1e3:.2f} ms", flush=True)

# async_op: a Request over the GPU operation.
with on(s):
    spin(100)
    x = to_dev(data(me), dt)
    req = comm.allreduce(x, async_op=True)
    if not req.is_gpu:
        fail("expected a GPU request")
    if req.wait(timeout=30) is not x:
        fail("Request.wait must return the output")
    if not req.test():
        fail("test() after wait() must be True")
    check("async allreduce", x, np.sum([data(r) for r in range(n)], 0))
    out = zeros(n * COUNT, dt)
    reqs = [comm.allgather(to_dev(data(me), dt), out, async_op=True), comm.barrier(async_op=True)]
    for r in reqs:
        r.wait(timeout=30)
    check("async allgather", out, np.concatenate([data(r) for r in range(n)]))
comm.synchronize()

# The Ray-style helpers keep GPU tensors on their device.
x = to_dev(data(me), dt)
st = _arrays.empty_stack(x, n)
if str(st.device) != str(x.device) or tuple(st.shape) != (n, COUNT):
    fail(f"empty_stack made {st.shape} on {st.device}")
cat = _arrays.concat([x, x])
if str(cat.device) != str(x.device):
    fail("concat left the device")


# Argument errors are raised at the call, on every rank alike, and leave the group usable.
def expect(exc, fn, words):
    try:
        fn()
    except exc as e:
        if not all(w in str(e) for w in words):
            fail(f"{exc.__name__} without {words}: {e}")
        return e
    fail(f"expected {exc.__name__}")


x = to_dev(data(me), dt)
expect(TypeError, lambda: comm.allreduce(x, out=np.zeros(COUNT, np.float32)), ["CUDA", "host"])
expect(TypeError, lambda: comm.allgather(np.ones(COUNT, np.float32), zeros(n * COUNT, dt)), ["CUDA", "host"])
expect(TypeError, lambda: comm.allreduce(x, out=zeros(COUNT, DTYPES["float16"])), ["dtype"])
# NCCL has no bitwise reduction: Accord's own kernels run it for ranks of one host (under the
# default ACCORD_GPU_ENGINE=auto); otherwise it is refused, naming the operator. Never garbage.
ones = int_array(4)
ones[:2] = 3 if me == 0 else 1
try:
    comm.allreduce(ones, op="band")
except accord.UnsupportedError as e:
    if "bitwise" not in str(e):
        fail(f"UnsupportedError without 'bitwise': {e}")
else:
    check("bitwise and", ones, np.array([1, 1, 1, 1], np.float32))
expect(ValueError, lambda: comm.send(x, (me + 1) % n, tag=3), ["tag"])
comm.allreduce(x)
check("after argument errors", x, np.sum([data(r) for r in range(n)], 0))

# A desync on a group of its own (split: its NCCL communicator is created on first use): rank 0
# broadcasts 1024 elements while the others reduce 1000. Reported as DesyncError instead of a
# hang or silent garbage.
sub = comm.split(0)
y = zeros(1024, dt)
sub.allreduce(y)
sub.synchronize()
t0 = time.perf_counter()
err = None
try:
    if me == 0:
        sub.broadcast(y, root=0)
    else:
        sub.allreduce(y[:1000])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        sub.synchronize()
        time.sleep(0.2)
except accord.DesyncError as e:
    err = e
except accord.AccordError as e:
    fail(f"expected DesyncError, got {type(e).__name__}: {e}")
if err is None:
    fail("mismatched GPU calls went unnoticed")
print(f"desync rank {me} after {time.perf_counter() - t0:.2f} s: {err}", flush=True)
comm.barrier()  # the host group is still fine
print(f"GPU-OK {FW} {me}", flush=True)
