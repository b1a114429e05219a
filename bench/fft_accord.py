#!/usr/bin/env python3
"""Distributed 3-D FFT with accord.distributed.fft: the side bench/fft.sh compares against
bench/fft_mpi4py.py and bench/fft_numpy.py. Not written yet: it exits with status 2 and says
so, and bench/fft.sh shows its column as missing.

It will take the same arguments (--shape, --dtype, --reps, --warmup) and print the same JSON
line from rank 0 ({"impl": "accord", "shape", "ranks", "dtype", "forward_s", "backward_s",
"all", ...}), run as `accord run -n P python bench/fft_accord.py ...`.
"""
import sys

print("bench/fft_accord.py: not yet: the accord side of the FFT benchmark is not written",
      file=sys.stderr)
sys.exit(2)
