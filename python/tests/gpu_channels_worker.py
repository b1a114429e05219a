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

MODE = sys.argv[1] if len(sys.argv) > 1 else "all"
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

// Block b serves peer b: all its threads put this rank's slice cooperatively, then thread 0
// signals (put_with_signal's cooperative form) and waits.
extern "C" __global__ void exchange_blocks(accord::MemoryChannel* ch, int rank, int nranks,
                                           unsigned long long bytes) {
  int t = blockIdx.x;
  if (t >= nranks || t == rank) return;
  unsigned long long per = bytes / nranks, off = rank * per;
  ch[t].put_with_signal(off, off, per, threadIdx.x, blockDim.x);
  if (threadIdx.x == 0) ch[t].wait();
}

// Every rank reads every peer's own slice with get (after a barrier on the host).
extern "C" __global__ void get_all(accord::MemoryChannel* ch, int rank, int nranks,
                                   unsigned long long bytes) {
  int t = blockIdx.x;
  if (t >= nranks || t == rank) return;
  unsigned long long per = bytes / nranks, off = t * per;
  ch[t].get(off, off, per, threadIdx.x, blockDim.x);
}

// Signal, flush, and wait: a pure handshake with every peer.
extern "C" __global__ void handshake(accord::MemoryChannel* ch, int rank, int nranks) {
  int t = threadIdx.x;
  if (t < nranks && t != rank) {
    ch[t].signal();
    ch[t].flush();
    ch[t].wait();
  }
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


if MODE == "kill":
    # Rank 1 dies (as a crash would) while rank 0's kernel waits for its signal: the wait ends
    # within the channels' timeout, check() names rank 1, and the GPU still runs kernels.
    import time

    comm.timeout = 2.0
    b = acuda.empty_symmetric(1024, "int32")
    ch = acuda.memory_channels(b)
    comm.barrier()
    if me == 1:
        print("rank 1 exits without warning", flush=True)
        os._exit(0)
    start = time.monotonic()
    acuda.KernelBuilder(source=SOURCE, kernel_name="wait_for").kernel().launch(1, 32, acuda.pack(ch, np.int32(1)))
    cupy.cuda.runtime.deviceSynchronize()
    took = time.monotonic() - start
    try:
        ch.check()
        fail("a wait on a dead rank succeeded")
    except accord.TimeoutError as e:
        assert e.waiting_for == [1], e
        print(f"rank 0: wait on the killed rank ended after {took:.2f}s: {e}", flush=True)
    assert took < 6.0, took
    out = cupy.zeros(10, dtype=cupy.int32)
    acuda.KernelBuilder(source=SOURCE, kernel_name="fill").kernel().launch(1, 32, acuda.pack(out, np.int32(3), np.int32(10)))
    cupy.cuda.runtime.deviceSynchronize()
    assert int(out.sum()) == 30
    print("KILL-OK 0", flush=True)
    os._exit(0)

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

# 2b. The other calls: cooperative put_with_signal, get, signal/flush/wait; and two buffers'
# channels used at once from two streams.
def reset(b):
    b[:] = -1
    b[me * per:(me + 1) * per] = cupy.arange(per, dtype=cupy.int32) + me * 100_000
    sync()


def whole(b, what):
    got = cupy.asnumpy(b)
    for r in range(n):
        if not np.array_equal(got[r * per:(r + 1) * per], np.arange(per, dtype=np.int32) + r * 100_000):
            fail(f"{what}: slice of rank {r} is wrong: {got[r * per:r * per + 4]}")


second = acuda.empty_symmetric(ELEMS, "int32", array="cupy")
ch2 = acuda.memory_channels(second)
reset(buf)
reset(second)
comm.barrier()
s1, s2 = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
args = lambda c: acuda.pack(c, np.int32(me), np.int32(n), np.uint64(per * n * 4))
kernel("exchange_blocks").launch(n, 128, args(chans), stream=s1)
kernel("exchange").launch(1, 512, args(ch2), stream=s2)
s1.synchronize()
s2.synchronize()
chans.check()
ch2.check()
comm.barrier()
whole(buf, "put_with_signal (cooperative) on stream 1")
whole(second, "put_with_signal_and_flush on stream 2")
reset(buf)
comm.barrier()
kernel("get_all").launch(n, 128, args(chans))
sync()
comm.barrier()
whole(buf, "get")
kernel("handshake").launch(1, 32, acuda.pack(chans, np.int32(me), np.int32(n)))
sync()
chans.check()
print(f"rank {me}: cooperative put, get, handshake and two streams at once passed", flush=True)
ch2.free()
acuda.free_symmetric(second)
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
