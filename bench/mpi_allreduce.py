#!/usr/bin/env python3
# Adapted for this repository from the reference baseline scripts (bench/compare.sh runs it).
"""OpenMPI (mpi4py) CPU collective baseline.

Run:  mpirun --allow-run-as-root --oversubscribe -n N .venv/bin/python mpi_allreduce.py [--ops ...]

Each timed iteration is: Barrier; t0; collective; t1.  The per-iteration time is
the max over ranks (Allreduce MAX of the per-rank times), and the table shows the
median and min over iterations.  float32 buffers, SUM for allreduce.
"""
import argparse
import sys
import time

import numpy as np
from mpi4py import MPI

sys.path.insert(0, __import__("os").path.dirname(__file__))
from benchcommon import common_args, sizes, pick_iters, summarize, print_table  # noqa: E402

comm = MPI.COMM_WORLD
rank, n = comm.Get_rank(), comm.Get_size()


def make_op(op, nbytes):
    """Return (callable, check, actual_bytes) for one size."""
    count = max(1, nbytes // 4)
    if op == "allreduce":
        send = np.full(count, rank + 1, dtype=np.float32)
        recv = np.empty(count, dtype=np.float32)

        def run():
            comm.Allreduce(send, recv, op=MPI.SUM)

        def check():
            exp = n * (n + 1) / 2
            assert recv[0] == exp and recv[-1] == exp, (recv[0], recv[-1], exp)
        return run, check, count * 4
    if op == "broadcast":
        buf = np.full(count, rank + 1, dtype=np.float32)

        def run():
            comm.Bcast(buf, root=0)

        def check():
            assert buf[0] == 1 and buf[-1] == 1
        return run, check, count * 4
    if op == "allgather":
        per = max(1, count // n)
        send = np.full(per, rank + 1, dtype=np.float32)
        recv = np.empty(per * n, dtype=np.float32)

        def run():
            comm.Allgather(send, recv)

        def check():
            for r in range(n):
                assert recv[r * per] == r + 1
        return run, check, per * n * 4
    raise ValueError(op)


def bench(op, nbytes, args):
    run, check, actual = make_op(op, nbytes)
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        run()
    warm = (time.perf_counter() - t0) / max(1, args.warmup)
    check()
    warm = comm.allreduce(warm, op=MPI.MAX)
    iters = pick_iters(warm, args)
    times = np.empty(iters, dtype=np.float64)
    for i in range(iters):
        comm.Barrier()
        t0 = time.perf_counter()
        run()
        times[i] = time.perf_counter() - t0
    tmax = np.empty_like(times)
    comm.Allreduce(times, tmax, op=MPI.MAX)
    return summarize(op, n, actual, list(tmax))


def main():
    p = common_args(argparse.ArgumentParser(description=__doc__))
    args = p.parse_args()
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if rank == 0:
        print(f"# backend=mpi4py {__import__('mpi4py').__version__} | "
              f"{MPI.Get_library_version().replace(chr(0), '').strip().splitlines()[0]} | n={n} | float32")
    for op in ops:
        rows = []
        for b in sizes(args.min_bytes, args.max_bytes, args.factor):
            if op == "allgather" and b < 4 * n:
                continue
            rows.append(bench(op, b, args))
        if rank == 0:
            print_table(f"mpi {op} n={n}", rows)


if __name__ == "__main__":
    main()
