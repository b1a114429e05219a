#!/usr/bin/env python3
# Adapted for this repository from the reference baseline scripts (bench/compare.sh runs it).
"""torch.distributed (backend='gloo') CPU collective baseline.

Run:  .venv/bin/python gloo_allreduce.py -n N [--ops ...]
Spawns N processes with torch.multiprocessing, init via env:// on 127.0.0.1
(GLOO_SOCKET_IFNAME=lo).  Same timing method as mpi_allreduce.py: barrier;
t0; collective; t1; per-iteration max over ranks; median/min over iterations.
Each process uses torch.set_num_threads(1).
"""
import argparse
import os
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchcommon import common_args, sizes, pick_iters, summarize, print_table  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def worker(rank, n, args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=n)

    def make_op(op, nbytes):
        count = max(1, nbytes // 4)
        if op == "allreduce":
            t = torch.empty(count, dtype=torch.float32)

            # gloo allreduce is in place: refill so the check is meaningful
            def run():
                dist.all_reduce(t, op=dist.ReduceOp.SUM)

            def reset():
                t.fill_(rank + 1)

            def check():
                exp = n * (n + 1) / 2
                assert t[0].item() == exp and t[-1].item() == exp, (t[0].item(), exp)
            return run, reset, check, count * 4
        if op == "broadcast":
            t = torch.empty(count, dtype=torch.float32)

            def run():
                dist.broadcast(t, src=0)

            def reset():
                t.fill_(rank + 1)

            def check():
                assert t[0].item() == 1 and t[-1].item() == 1
            return run, reset, check, count * 4
        if op == "allgather":
            per = max(1, count // n)
            s = torch.full((per,), float(rank + 1), dtype=torch.float32)
            out = torch.empty(per * n, dtype=torch.float32)
            outs = list(out.chunk(n))

            def run():
                try:
                    dist.all_gather_into_tensor(out, s)
                except (RuntimeError, AttributeError, NotImplementedError):
                    dist.all_gather(outs, s)

            def reset():
                pass

            def check():
                for r in range(n):
                    assert out[r * per].item() == r + 1
            return run, reset, check, per * n * 4
        raise ValueError(op)

    def bench(op, nbytes):
        run, reset, check, actual = make_op(op, nbytes)
        reset()
        run()  # first call, then verify once
        check()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.warmup):
            run()
        warm = torch.tensor([(time.perf_counter() - t0) / max(1, args.warmup)], dtype=torch.float64)
        dist.all_reduce(warm, op=dist.ReduceOp.MAX)
        iters = pick_iters(warm.item(), args)
        times = torch.empty(iters, dtype=torch.float64)
        for i in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            run()
            times[i] = time.perf_counter() - t0
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        return summarize(op, n, actual, times.tolist())

    if rank == 0:
        print(f"# backend=torch.distributed gloo | torch {torch.__version__} | n={n} | float32 | "
              f"threads/proc=1", flush=True)
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for op in ops:
        rows = []
        for b in sizes(args.min_bytes, args.max_bytes, args.factor):
            if op == "allgather" and b < 4 * n:
                continue
            rows.append(bench(op, b))
        if rank == 0:
            print_table(f"gloo {op} n={n}", rows)
    dist.barrier()
    dist.destroy_process_group()


def main():
    p = common_args(argparse.ArgumentParser(description=__doc__))
    p.add_argument("-n", "--nprocs", type=int, default=2)
    args = p.parse_args()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(args.nprocs, args), nprocs=args.nprocs, join=True)


if __name__ == "__main__":
    main()
