"""Run by `mpirun -n 3 python mpi_worker.py`: accord bootstrapped from mpi4py alone."""

import numpy as np
from mpi4py import MPI

import accord

comm = accord.init(mpi_comm=MPI.COMM_WORLD, timeout=60)
assert comm.rank == MPI.COMM_WORLD.Get_rank() and comm.size == MPI.COMM_WORLD.Get_size()
x = np.full(4, comm.rank + 1, np.int64)
comm.allreduce(x)
assert x.tolist() == [comm.size * (comm.size + 1) // 2] * 4, x
out = np.zeros(comm.size, np.float32) if comm.rank == 0 else None
comm.gather(np.array([comm.rank], np.float32), out, root=0)
if comm.rank == 0:
    assert out.tolist() == list(range(comm.size))
comm.barrier()
print(f"MPI-OK {comm.rank}", flush=True)
