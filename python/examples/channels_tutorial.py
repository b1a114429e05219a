"""Every GPU of the host sends its slice of a buffer to every other GPU through memory channels.

The MSCCL++ tutorial ("put_with_signal_and_flush, then wait"), on Accord: run with
``accord run -n 4 python channels_tutorial.py`` (one process per GPU; processes may share a GPU,
and ``mpirun -n 4 python channels_tutorial.py --mpi`` works too). Needs CuPy.

Each rank owns ``size / nranks`` int32 elements of a 1,024-element buffer on the symmetric heap.
One block of 512 threads runs; thread ``t < nranks, t != rank`` puts this rank's slice into rank
``t``'s buffer, signals, flushes, and waits for rank ``t``'s slice to arrive. After a device
synchronise and a barrier every rank's buffer holds every rank's slice.
"""

import os
import sys

import cupy
import numpy as np

import accord
import accord.cuda

SOURCE = r"""
#include <accord/channel.cuh>

extern "C" __global__ void exchange(accord::MemoryChannel* channels, int rank, int nranks,
                                    unsigned long long bytes) {
  int t = threadIdx.x;
  unsigned long long per_rank = bytes / nranks;
  unsigned long long my_offset = rank * per_rank;
  if (t < nranks && t != rank) {
    channels[t].put_with_signal_and_flush(my_offset, my_offset, per_rank);
    channels[t].wait();
  }
}
"""

ELEMENTS = 1024


def main() -> int:
    if "--mpi" in sys.argv:
        from mpi4py import MPI

        comm = accord.init(mpi_comm=MPI.COMM_WORLD)
    else:
        comm = accord.init()
    rank, nranks = comm.rank, comm.size
    local = int(os.environ.get("LOCAL_RANK", rank))
    cupy.cuda.Device(local % cupy.cuda.runtime.getDeviceCount()).use()

    buf = accord.cuda.empty_symmetric(ELEMENTS, "int32", array="cupy", comm=comm)
    per_rank = ELEMENTS // nranks
    buf[:] = -1
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    buf[mine] = cupy.arange(per_rank, dtype=cupy.int32) + rank * 100_000
    cupy.cuda.get_current_stream().synchronize()
    channels = accord.cuda.memory_channels(buf)
    comm.barrier()  # every rank filled its slice before anyone reads it

    kernel = accord.cuda.KernelBuilder(source=SOURCE, kernel_name="exchange").kernel()
    args = accord.cuda.pack(channels, np.int32(rank), np.int32(nranks),
                            np.uint64(per_rank * nranks * 4))
    kernel.launch(1, 512, args)
    cupy.cuda.runtime.deviceSynchronize()
    channels.check()  # raises, naming the rank, if a wait timed out
    comm.barrier()

    got = cupy.asnumpy(buf)
    for r in range(nranks):
        want = np.arange(per_rank, dtype=np.int32) + r * 100_000
        if not np.array_equal(got[r * per_rank:(r + 1) * per_rank], want):
            print(f"rank {rank}: slice of rank {r} is wrong", flush=True)
            return 1
    print(f"rank {rank}: every rank's slice arrived ({nranks} ranks)", flush=True)
    channels.free()
    accord.cuda.free_symmetric(buf)
    return 0


if __name__ == "__main__":
    sys.exit(main())
