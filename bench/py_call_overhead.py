#!/usr/bin/env python3
"""The Python cost of one small call: a 4-byte float32 allreduce on a one-rank world, in place
and out of place, through Accord and, in the same process, through mpi4py (a singleton MPI world)
and with torch CPU tensors through Accord where torch is installed. Each figure is the best of
five timed loops of 100,000 calls (us per call); the sides alternate over ROUNDS rounds and the
table shows each side's median and the ratio Accord / mpi4py. The VM's noise is about 30 %.

Usage: python bench/py_call_overhead.py [ROUNDS]
"""
import statistics
import sys
import time

import numpy as np

import accord


def per_call(f, n=100_000):
    for _ in range(2000):
        f()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            f()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    server = accord.StoreServer("127.0.0.1", 0)
    comm = accord.init_from_store(0, 1, f"127.0.0.1:{server.port}", server.token, timeout=60, store=server)
    x, y = np.ones(1, np.float32), np.empty(1, np.float32)
    sides = {
        "accord in place": lambda: comm.allreduce(x),
        "accord out of place": lambda: comm.allreduce(x, out=y),
    }
    try:
        from mpi4py import MPI

        w = MPI.COMM_WORLD
        sides["mpi4py in place"] = lambda: w.Allreduce(MPI.IN_PLACE, x)
        sides["mpi4py out of place"] = lambda: w.Allreduce(x, y)
    except ImportError:
        print("note: mpi4py is not installed: no reference column")
    try:
        import torch

        tx, ty = torch.ones(1), torch.empty(1)
        sides["accord torch in place"] = lambda: comm.allreduce(tx)
        sides["accord torch out of place"] = lambda: comm.allreduce(tx, out=ty)
    except ImportError:
        print("note: torch is not installed: no tensor rows")
    got = {k: [] for k in sides}
    for r in range(rounds):
        order = list(sides.items())
        for name, f in order if r % 2 == 0 else reversed(order):
            got[name].append(per_call(f))
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"| call | us (median of {rounds}) | / mpi4py |")
    print("|---|---|---|")
    for name, t in med.items():
        mode = "in place" if name.endswith("in place") else "out of place"
        ref = med.get(f"mpi4py {mode}")
        ratio = f"{t / ref:.2f}" if ref and not name.startswith("mpi4py") else ""
        print(f"| {name} | {t:.3f} | {ratio} |")


if __name__ == "__main__":
    main()
