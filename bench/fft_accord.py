#!/usr/bin/env python3
"""Distributed 3-D FFT with accord.distributed.fft: the side bench/fft.sh compares against
bench/fft_mpi4py.py and bench/fft_numpy.py.

`accord run -n P python bench/fft_accord.py --shape 128,128,128 --dtype complex128`: X slabs
transformed forward into Y slabs and backward into X slabs (`redistribute=False`: one
transpose each way, as mpi4py-fft's slab PFFT does), numpy's normalisation (the backward
scaled by 1/N, as bench/fft_mpi4py.py asks of mpi4py-fft). Each repetition is barrier, time,
call; its time is the slowest rank's. Checks once that backward(forward(x)) is x and, for
arrays up to 64^3, that forward matches numpy.fft.fftn of the gathered array. Rank 0 prints
one JSON line.
"""
import argparse
import json
import time

import numpy as np

import accord
from accord.distributed import Slab
from accord.distributed.fft import FFT

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="128,128,128")
ap.add_argument("--dtype", default="complex128", choices=["complex64", "complex128"])
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=3)
args, _ = ap.parse_known_args()
shape = tuple(int(s) for s in args.shape.split(","))

comm = accord.init()
rank, size = comm.rank, comm.size
rng = np.random.default_rng(rank)
local = Slab.X.shape(comm, shape)
x = (rng.standard_normal(local) + 1j * rng.standard_normal(local)).astype(args.dtype)

t0 = time.perf_counter()
fwd = FFT(x, distribution=Slab.X, options={"redistribute": False}, comm=comm)
fwd.plan()
y = fwd.execute()
bwd = FFT(y, distribution=Slab.Y, options={"redistribute": False}, comm=comm)
bwd.plan()
plan_s = time.perf_counter() - t0

back = bwd.execute(direction="inverse")
tol = 1e-4 if args.dtype == "complex64" else 1e-10
err = float(np.max(np.abs(back - x))) if x.size else 0.0
worst = np.array([err])
comm.allreduce(worst, op="max")
check = {"round_trip_error": float(worst[0])}
if np.prod(shape) <= 64 ** 3:
    xs = accord._objects.all_gather_object(comm, x)
    ys = accord._objects.all_gather_object(comm, y)
    want = np.fft.fftn(np.concatenate(xs, axis=0))
    got = np.concatenate(ys, axis=1)
    check["forward_rel_error"] = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    assert check["forward_rel_error"] < tol, check
assert worst[0] < tol, check


def timed(fn, reps, warmup):
    out = []
    for i in range(warmup + reps):
        comm.barrier()
        t = time.perf_counter()
        fn()
        t = np.array([time.perf_counter() - t])
        comm.allreduce(t, op="max")
        if i >= warmup:
            out.append(float(t[0]))
    return out


f = timed(fwd.execute, args.reps, args.warmup)
b = timed(lambda: bwd.execute(direction="inverse"), args.reps, args.warmup)
if rank == 0:
    print(json.dumps({
        "impl": "accord", "shape": list(shape), "ranks": size, "dtype": args.dtype,
        "forward_s": float(np.median(f)), "backward_s": float(np.median(b)),
        "all": f, "all_backward": b, "plan_s": plan_s, "distribution": "X slabs -> Y slabs",
        **check,
    }), flush=True)
