"""One rank of test_gpu_c_handle_nccl_handles_and_cxx_device_code: a CUDA allreduce attaches the
GPU; its NCCL handles are there; the RAFT example built with nvcc (argv[1]) allreduces device
memory on torch's stream through this rank's lent handle."""

import ctypes
import sys

import torch

import accord

comm = accord.init()
torch.cuda.set_device(comm.rank % torch.cuda.device_count())
x = torch.ones(4, device="cuda")
comm.allreduce(x)
torch.cuda.synchronize()
assert x.tolist() == [float(comm.size)] * 4, x

assert comm.nccl_comm() != 0
uid = comm.nccl_unique_id()
assert isinstance(uid, bytes) and len(uid) == 128
assert all(other == uid for other in comm.all_gather_object(uid)), "ranks disagree on the NCCL unique id"

example = ctypes.CDLL(sys.argv[1]).accord_example_allreduce
example.restype, example.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
assert example(comm.c_handle(), torch.cuda.current_stream().cuda_stream) == 1
print(f"GPU-C-HANDLE-OK {comm.rank}", flush=True)
