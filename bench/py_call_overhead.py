#!/usr/bin/env python3
"""The Python cost of one small call: a 4-byte float32 allreduce on a one-rank world, in place
and out of place, best of five timed loops of 200,000 calls (us per call). Run each build in
turn, several times, and compare the best figures; the VM's noise is about 30 %.

Usage: python bench/py_call_overhead.py [LABEL]
"""
import sys
import time

import numpy as np

import accord


def per_call(f, n=200_000):
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
    server = accord.StoreServer("127.0.0.1", 0)
    comm = accord.init_from_store(0, 1, f"127.0.0.1:{server.port}", server.token, timeout=60, store=server)
    x, y = np.ones(1, np.float32), np.empty(1, np.float32)
    label = sys.argv[1] if len(sys.argv) > 1 else "accord"
    print(f"{label}: in place {per_call(lambda: comm.allreduce(x)):.3f} us, "
          f"out of place {per_call(lambda: comm.allreduce(x, out=y)):.3f} us")


if __name__ == "__main__":
    main()
