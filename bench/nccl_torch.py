"""torch.distributed (NCCL) on the same sizes, timing method and size convention as
`accord bench --device cuda`, for side-by-side comparison (see gpu_compare.sh).

Sizes follow nccl-tests: the whole buffer (allgather: the gathered output; reduce_scatter and
alltoall: the full input). Each size: warm-up, then CUDA events around `iters` back-to-back calls
on the current stream; the slowest rank's mean time per call is reported.

Usage: python3 nccl_torch.py NRANKS OUT.json [MIN_BYTES MAX_BYTES FACTOR]
"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

OPS = os.environ.get("ACCORD_COMPARE_OPS", "allreduce allgather reduce_scatter alltoall broadcast").split()


def bus_factor(op, n):
    return 2 * (n - 1) / n if op == "allreduce" else (1.0 if op == "broadcast" else (n - 1) / n)


def iterations(nbytes):
    iters = min(max((2 << 30) // max(nbytes, 4096), 20), 300)
    return iters // 10 + 2, iters


def worker(rank, n, port, out, sizes):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=n, device_id=dev)
    rows = []
    for op in OPS:
        for nbytes in sizes:
            unit = 4 * n if op in ("allgather", "reduce_scatter", "alltoall") else 4
            count = (nbytes // unit) * unit // 4
            if count == 0:
                continue
            block = count // n
            if op == "allgather":
                x, y = torch.randn(block, device=dev), torch.empty(count, device=dev)
                f = lambda: dist.all_gather_into_tensor(y, x)
            elif op == "reduce_scatter":
                x, y = torch.randn(count, device=dev), torch.empty(block, device=dev)
                f = lambda: dist.reduce_scatter_tensor(y, x)
            elif op == "alltoall":
                x, y = torch.randn(count, device=dev), torch.empty(count, device=dev)
                f = lambda: dist.all_to_all_single(y, x)
            elif op == "allreduce":
                x = torch.randn(count, device=dev)
                f = lambda: dist.all_reduce(x)
            else:
                x = torch.randn(count, device=dev)
                f = lambda: dist.broadcast(x, 0)
            warm, iters = iterations(count * 4)
            for _ in range(warm):
                f()
            torch.cuda.synchronize()
            dist.barrier()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                f()
            e.record()
            torch.cuda.synchronize()
            t = torch.tensor([s.elapsed_time(e) * 1000 / iters], device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            us = t.item()
            algbw = count * 4 / us / 1e3
            rows.append({"op": op, "bytes": count * 4, "time_us": us, "algbw_gbps": algbw,
                         "busbw_gbps": algbw * bus_factor(op, n)})
    if rank == 0:
        ver = ".".join(map(str, torch.cuda.nccl.version()))
        with open(out, "w") as fh:
            json.dump({"ranks": n, "nccl": ver, "torch": torch.__version__, "rows": rows}, fh)
        print(f"# torch.distributed nccl: n={n} nccl={ver} torch={torch.__version__}")
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else torch.cuda.device_count()
    out = sys.argv[2] if len(sys.argv) > 2 else f"/tmp/torch_nccl_{n}.json"
    lo, hi, fac = (int(v) for v in sys.argv[3:6]) if len(sys.argv) > 5 else (8, 512 << 20, 4)
    sizes = []
    b = lo
    while b <= hi:
        sizes.append(b)
        b *= fac
    mp.spawn(worker, args=(n, 29600 + n, out, sizes), nprocs=n)
