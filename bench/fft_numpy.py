#!/usr/bin/env python3
"""Single-process numpy.fft.fftn of the whole global array: the fallback reference of the
distributed FFT benchmark (bench/fft.sh), with the same JSON line as bench/fft_mpi4py.py.

    python bench/fft_numpy.py --shape 128,128,128 [--dtype complex128] [--reps 20] [--warmup 3]

Timed, each repetition: t0; numpy.fft.fftn(a, axes=(0, 1, 2)); t1, and ifftn of the result
(scaled by 1/N, numpy's default). numpy allocates the result on every call, as the call is
normally made. numpy 2 keeps complex64 in single precision. One process, one thread ("ranks":
1); the medians are over repetitions. Before timing it checks that ifftn(fftn(a)) returns a.

complex64 forward is slow in numpy 2.4: the unscaled forward transform passes the scale factor
as the Python int 1, which sends the gufunc through a slower loop (on a 2-CPU VM one 64^3
complex64 pass along an axis: 3.3 ms with the int 1, 0.63 ms with numpy.float32(1)); fftn of
complex64 then takes about 4x its ifftn. complex128 is not affected. The numbers here are
numpy as it is called, quirk included.
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def parse_ints(s):
    return tuple(int(x) for x in s.replace("x", ",").split(",") if x.strip())


p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--shape", default="64,64,64", type=parse_ints)
p.add_argument("--dtype", default="complex128", choices=["complex128", "complex64"])
p.add_argument("--reps", default=20, type=int)
p.add_argument("--warmup", default=3, type=int)
args = p.parse_args()
dtype = np.dtype(args.dtype)

rng = np.random.default_rng(0)
a = (rng.standard_normal(args.shape) + 1j * rng.standard_normal(args.shape)).astype(dtype)
axes = tuple(range(len(args.shape)))

ah = np.fft.fftn(a, axes=axes)
back = np.fft.ifftn(ah, axes=axes)
tol = 1e-12 if dtype == np.complex128 else 2e-5
rt = float(np.linalg.norm(back - a) / np.linalg.norm(a))
if ah.dtype != dtype or not rt < tol:
    print(json.dumps({"impl": "numpy", "shape": list(args.shape), "ranks": 1, "dtype": args.dtype,
                      "error": f"round trip rel. error {rt:.3g} (tolerance {tol:g}), "
                               f"result dtype {ah.dtype}"}), flush=True)
    sys.exit(1)


def timed(fn):
    for _ in range(args.warmup):
        fn()
    out = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


fwd = timed(lambda: np.fft.fftn(a, axes=axes))
bwd = timed(lambda: np.fft.ifftn(ah, axes=axes))
print(json.dumps({
    "impl": "numpy",
    "shape": list(args.shape),
    "ranks": 1,
    "dtype": args.dtype,
    "forward_s": statistics.median(fwd),
    "backward_s": statistics.median(bwd),
    "all": fwd,
    "all_backward": bwd,
    "reps": args.reps,
    "warmup": args.warmup,
    "check": {"shape": list(args.shape), "roundtrip_rel_err": rt},
    "versions": {"numpy": np.__version__},
    "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
}), flush=True)
