"""One rank of test_c_handle.py: the RAFT example and the every-collective check (C++ shared
libraries given as arguments) on this rank's lent handle."""

import ctypes
import sys

import accord

comm = accord.init()
raft = ctypes.CDLL(sys.argv[1]).accord_example_allreduce
raft.restype, raft.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p]
every = ctypes.CDLL(sys.argv[2]).accord_every_collective
every.restype, every.argtypes = ctypes.c_int, [ctypes.c_void_p]
assert raft(comm.c_handle(), None) == 1, "the RAFT example's allreduce is not the world size"
assert every(comm.c_handle()) == 0, "a collective gave a wrong result (see stderr)"
print(f"rank {comm.rank}: c_handle ok", flush=True)
