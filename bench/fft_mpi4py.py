#!/usr/bin/env python3
"""Distributed 3-D complex FFT with mpi4py-fft: the MPI reference for the distributed FFT.

    mpirun -n P python bench/fft_mpi4py.py --shape 128,128,128 [--dtype complex128]
        [--grid=-1] [--reps 20] [--warmup 3] [--backend fftw] [--no-collapse]

`PFFT(MPI.COMM_WORLD, shape, axes=(0, 1, 2), dtype, grid)`: grid `-1` is a slab decomposition
(the input split along axis 0, the output along axis 1: what `Slab.X` means); `--grid=-1,-1`
or `--grid=2,2` are pencils. The serial transforms are FFTW's (`--backend numpy` where the
FFTW backend did not build; the backend actually used is in the output). With `--collapse`
(the default) the two local axes of a slab are transformed by one 2-D FFTW plan;
`--no-collapse` plans one 1-D transform per axis, which costs a local copy between them.

Scaling follows numpy.fft: forward unscaled (`normalize=False`), backward scaled by 1/N
(`normalize=True`), so forward then backward returns the input.

Timed, each repetition: Barrier; t0; fft.forward(u, uh); t1, and the same for
fft.backward(uh, u2). That is mpi4py-fft's documented call with the caller's arrays, which
copies the input into the plan's own array and the result out of it. `forward_planned_s`
times `fft.forward()` on the plan's own arrays (no copies; the input is refilled before each
repetition, outside the timer, because FFTW may destroy it). A repetition's time is the
maximum over ranks; the medians are over repetitions.

Before timing it checks the transform once: forward then backward returns the input, and the
forward result gathered on rank 0 equals numpy.fft.fftn of the gathered global input (on the
benchmark shape when it has at most 2**21 points, otherwise on 32x24x16 with the same grid).
A failed check prints {"impl": ..., "error": ...} and exits 1.

Rank 0 prints one JSON line:
    {"impl": "mpi4py-fft", "shape": [...], "ranks": P, "dtype": ..., "forward_s": median,
     "backward_s": median, "all": [forward times], "all_backward": [...], ...}
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, nranks = comm.Get_rank(), comm.Get_size()


def parse_ints(s):
    return tuple(int(x) for x in s.replace("x", ",").split(",") if x.strip())


p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--shape", default="64,64,64", type=parse_ints)
p.add_argument("--dtype", default="complex128", choices=["complex128", "complex64"])
p.add_argument("--grid", default="-1", type=parse_ints,
               help="processor grid: -1 = slab on axis 0 (default); -1,-1 or 2,2 = pencils "
                    "(write --grid=-1,-1: a value starting with '-' needs the '=')")
p.add_argument("--reps", default=20, type=int)
p.add_argument("--warmup", default=3, type=int)
p.add_argument("--backend", default="fftw", choices=["fftw", "numpy"])
p.add_argument("--collapse", default=True, action=argparse.BooleanOptionalAction)
p.add_argument("--no-check", dest="check", action="store_false")
args = p.parse_args()
dtype = np.dtype(args.dtype)

from mpi4py_fft import PFFT, newDistArray  # noqa: E402  (after argparse: --help needs no MPI run)

backend = args.backend
if backend == "fftw":
    try:
        from mpi4py_fft.fftw import fftw_xfftn  # noqa: F401  (the compiled FFTW wrapper)
    except ImportError as e:
        if rank == 0:
            print(f"# FFTW backend unavailable ({e}); using numpy", file=sys.stderr)
        backend = "numpy"


def plan(shape):
    return PFFT(comm, shape, axes=(0, 1, 2), dtype=dtype, grid=args.grid, backend=backend,
                collapse=args.collapse)


def fail(msg):
    if rank == 0:
        print(json.dumps({"impl": "mpi4py-fft", "shape": list(args.shape), "ranks": nranks,
                          "dtype": args.dtype, "error": msg}), flush=True)
    comm.Barrier()
    sys.exit(1)


def global_input(shape, seed=1234):
    """The same global array on every rank (only used by the check)."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal(shape) + 1j * rng.standard_normal(shape)
    return g.astype(dtype)


def check(shape):
    """Forward vs numpy.fft.fftn of the gathered input, and forward-backward round trip."""
    fft = plan(shape)
    u = newDistArray(fft, False)
    uh = newDistArray(fft, True)
    g = global_input(shape)
    u[...] = g[fft.local_slice(False)]
    fft.forward(u, uh, normalize=False)
    u2 = np.zeros_like(u)
    fft.backward(uh, u2, normalize=True)
    tol = 1e-12 if dtype == np.complex128 else 2e-5
    rt = np.linalg.norm(np.asarray(u2) - np.asarray(u)) / max(np.linalg.norm(np.asarray(u)), 1e-300)
    rt = float(comm.allreduce(rt, op=MPI.MAX))
    pieces = comm.gather((fft.local_slice(True), np.asarray(uh).copy()), root=0)
    err = 0.0
    if rank == 0:
        out = np.empty(shape, dtype=dtype)
        for sl, piece in pieces:
            out[sl] = piece
        ref = np.fft.fftn(g.astype(np.complex128))
        err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    err = comm.bcast(err, root=0)
    fft.destroy()
    if not (rt < tol and err < tol):
        fail(f"check failed on shape {list(shape)}: round trip rel. error {rt:.3g}, "
             f"forward vs numpy.fft.fftn rel. error {err:.3g} (tolerance {tol:g})")
    return {"shape": list(shape), "roundtrip_rel_err": rt, "vs_numpy_rel_err": err}


def timed(fn, reps, warmup, before=None):
    for _ in range(warmup):
        if before:
            before()
        fn()
    out = []
    for _ in range(reps):
        if before:
            before()
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        out.append(comm.allreduce(t1 - t0, op=MPI.MAX))
    return out


checked = None
if args.check:
    small = args.shape if int(np.prod(args.shape)) <= 2 ** 21 else (32, 24, 16)
    checked = check(small)

fft = plan(args.shape)
u = newDistArray(fft, False)
uh = newDistArray(fft, True)
u2 = newDistArray(fft, False)
rng = np.random.default_rng(rank)
u[...] = (rng.standard_normal(u.shape) + 1j * rng.standard_normal(u.shape)).astype(dtype)

fwd = timed(lambda: fft.forward(u, uh, normalize=False), args.reps, args.warmup)
bwd = timed(lambda: fft.backward(uh, u2, normalize=True), args.reps, args.warmup)
plan_in = fft.forward.input_array


def refill():
    plan_in[...] = u


fwd_planned = timed(lambda: fft.forward(normalize=False), args.reps, args.warmup, before=refill)

if rank == 0:
    import mpi4py
    import mpi4py_fft
    print(json.dumps({
        "impl": "mpi4py-fft",
        "shape": list(args.shape),
        "ranks": nranks,
        "dtype": args.dtype,
        "forward_s": statistics.median(fwd),
        "backward_s": statistics.median(bwd),
        "forward_planned_s": statistics.median(fwd_planned),
        "all": fwd,
        "all_backward": bwd,
        "all_forward_planned": fwd_planned,
        "grid": [fft.subcomm[i].Get_size() for i in range(len(args.shape))],
        "backend": backend,
        "collapse": args.collapse,
        "reps": args.reps,
        "warmup": args.warmup,
        "check": checked,
        "versions": {"mpi4py-fft": mpi4py_fft.__version__, "mpi4py": mpi4py.__version__,
                     "numpy": np.__version__,
                     "mpi": MPI.Get_library_version().splitlines()[0].strip("\x00 ")},
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }), flush=True)
fft.destroy()
