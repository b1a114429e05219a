"""One rank of the channel checks: `accord run -n N python gpu_channels_worker.py`.

Ranks may share one GPU (LOCAL_RANK % devices). Checks, on CuPy arrays of the symmetric heap:
the ported MSCCL++ tutorial (put_with_signal_and_flush + wait between every pair), peer views,
LL packets of odd sizes with two flags in a row without clearing, mismatched sizes, an ordinary
array refused where a symmetric one is needed, and a wait that is never signalled (rank 0 waits
for rank 1, which never signals: the wait returns within the timeout, check() names rank 1, and
the GPU still runs kernels). Prints `CHANNELS-OK <rank>` at the end.
"""

import os
import sys

import cupy
import numpy as np

import accord
import accord.cuda as acuda

comm = accord.init(timeout=60)
n, me = comm.size, comm.rank
cupy.cuda.Device(int(os.environ.get("LOCAL_RANK", me)) % cupy.cuda.runtime.getDeviceCount()).use()

SOURCE = r"""
#include <accord/channel.cuh>

extern "C" __global__ void exchange(accord::MemoryChannel* ch, int rank, int nranks,
                                    unsigned long long bytes) {
  int t = threadIdx.x;
  unsigned long long per = bytes / nranks, off = rank * per;
  if (t < nranks && t != rank) {
    ch[t].put_with_signal_and_flush(off, off, per);
    ch[t].wait();
  }
}

// Packets to the next rank land at byte 4096 of its buffer; the previous rank's, read from this
// buffer's byte 4096, are unpacked at byte 65536.
extern "C" __global__ void packets(accord::MemoryChannel* ch, int rank, int nranks,
                                   unsigned long long bytes, unsigned int flag) {
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  ch[next].put_packets(4096, 0, bytes, flag, threadIdx.x, blockDim.x);
  ch[prev].read_packets(65536, 4096, bytes, flag, threadIdx.x, blockDim.x);
}

extern "C" __global__ void wait_for(accord::MemoryChannel* ch, int peer) {
  if (threadIdx.x == 0) ch[peer].wait();
}

extern "C" __global__ void fill(int* p, int v, int count) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < count) p[i] = v;
}
"""


def fail(msg):
    print(f"FAIL rank {me}: {msg}", flush=True)
    sys.exit(1)


def kernel(name):
    return acuda.KernelBuilder(source=SOURCE, kernel_name=name).kernel()


def sync():
    cupy.cuda.runtime.deviceSynchronize()


# 1. The MSCCL++ tutorial, ported.
ELEMS = 1024
per = ELEMS // n
buf = acuda.empty_symmetric(ELEMS, "int32", array="cupy")
buf[:] = -1
buf[me * per:(me + 1) * per] = cupy.arange(per, dtype=cupy.int32) + me * 100_000
sync()
chans = acuda.memory_channels(buf)
comm.barrier()
kernel("exchange").launch(1, 512, acuda.pack(chans, np.int32(me), np.int32(n), np.uint64(per * n * 4)))
sync()
chans.check()
comm.barrier()
got = cupy.asnumpy(buf)
for r in range(n):
    if not np.array_equal(got[r * per:(r + 1) * per], np.arange(per, dtype=np.int32) + r * 100_000):
        fail(f"tutorial: slice of rank {r} is wrong: {got[r * per:r * per + 4]}")
print(f"rank {me}: tutorial exchange of {n} slices passed", flush=True)

# 2. Peer views are the peers' arrays.
for p in comm.symmetric_peers():
    view = acuda.peer_view(buf, p)
    if not np.array_equal(cupy.asnumpy(view), got):
        fail(f"peer view of rank {p} differs")
try:
    acuda.peer_view(cupy.zeros(4, dtype=cupy.int32), 0)
    fail("an ordinary array passed for a symmetric one")
except ValueError as e:
    assert "symmetric heap" in str(e), e
chans.free()
acuda.free_symmetric(buf)

# 3. Packets: odd sizes, flags 1 then 2 without clearing the landing area.
pk = acuda.empty_symmetric(1 << 18, "uint8", array="cupy")
pch = acuda.memory_channels(pk)
k = kernel("packets")
prev = (me + n - 1) % n
for size in (1, 3, 7, 13, 4097):
    for flag in (1, 2):
        data = (np.arange(size) * (me + 3) + flag * 11).astype(np.uint8)
        pk[:size] = cupy.asarray(data)
        sync()
        comm.barrier()
        k.launch(1, 256, acuda.pack(pch, np.int32(me), np.int32(n), np.uint64(size), np.uint32(flag)))
        sync()
        pch.check()
        want = (np.arange(size) * (prev + 3) + flag * 11).astype(np.uint8)
        if not np.array_equal(cupy.asnumpy(pk[65536:65536 + size]), want):
            fail(f"packets of {size} bytes, flag {flag}: wrong data")
        comm.barrier()
print(f"rank {me}: packets of 1-4097 bytes with two flags passed", flush=True)
pch.free()
acuda.free_symmetric(pk)

# 4. Sizes must match.
try:
    acuda.empty_symmetric(256 * (me + 1), "int32")
    fail("mismatched sizes were accepted")
except ValueError as e:
    assert "same size" in str(e) and "rank 0 asked for" in str(e), e

# 5. A wait that is never signalled: bounded, named, and the GPU stays usable.
if n >= 2:
    comm.timeout = 1.0  # the channels take the timeout in force when they are made
    w = acuda.empty_symmetric(4096, "int32")
    wch = acuda.memory_channels(w)
    comm.timeout = 60.0
    if me == 0:
        kernel("wait_for").launch(1, 32, acuda.pack(wch, np.int32(1)))
        sync()
        try:
            wch.check()
            fail("a wait that was never signalled succeeded")
        except accord.TimeoutError as e:
            assert e.waiting_for == [1], e
            print(f"rank 0: unsignalled wait reported: {e}", flush=True)
        out = cupy.zeros(100, dtype=cupy.int32)
        kernel("fill").launch(1, 128, acuda.pack(out, np.int32(7), np.int32(100)))
        sync()
        if int(out.sum()) != 700:
            fail("the GPU did not run a kernel after a timed-out wait")
    comm.barrier()
    wch.free()
    acuda.free_symmetric(w)

# 6. torch tensors on the heap, where torch is installed.
try:
    import torch
except ImportError:
    torch = None
if torch is not None:
    torch.cuda.set_device(cupy.cuda.Device().id)
    t = acuda.empty_symmetric((8,), "float32", array="torch")
    t.fill_(float(me))
    torch.cuda.synchronize()
    comm.barrier()
    for p in comm.symmetric_peers():
        if not torch.equal(acuda.peer_view(t, p), torch.full((8,), float(p), device=t.device)):
            fail(f"torch peer view of rank {p} differs")
    comm.barrier()
    acuda.free_symmetric(t)
    print(f"rank {me}: torch tensors on the heap passed", flush=True)

print(f"CHANNELS-OK {me}", flush=True)
