"""torch.distributed all_reduce latency, backend "accord" against "gloo" in the same job:
both groups over the same ranks, sizes alternating between the two, several rounds, medians
and the ratio accord / gloo.

    accord run -n 2 python bench/torch_backend.py [ROUNDS]     (or under torchrun)
"""

import statistics
import sys
import time

import torch
import torch.distributed as dist

if not hasattr(dist.Backend, "_ensure_backend_registered"):
    import accord.torch  # noqa: F401  (a torch without backend entry points: register by import)
ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 5
SIZES = [4, 64, 1024, 16 << 10, 64 << 10, 1 << 20]

dist.init_process_group("accord")
groups = {"accord": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
rank = dist.get_rank()


def per_call_us(group, t, iters):
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, group=group)
    return (time.perf_counter() - t0) / iters * 1e6


results = {(name, b): [] for name in groups for b in SIZES}
for _ in range(ROUNDS):
    for b in SIZES:
        t = torch.ones(b // 4, dtype=torch.float32)
        iters = max(20, min(2000, (4 << 20) // max(b, 1)))
        for name, g in groups.items():
            per_call_us(g, t, 5)  # warm-up
            results[(name, b)].append(per_call_us(g, t, iters))

if rank == 0:
    print(f"# torch.distributed all_reduce, {dist.get_world_size()} ranks, float32, {ROUNDS} rounds (median us per call)")
    print(f"{'bytes':>10} {'accord':>10} {'gloo':>10} {'accord/gloo':>12}")
    for b in SIZES:
        a, g = statistics.median(results[("accord", b)]), statistics.median(results[("gloo", b)])
        print(f"{b:>10} {a:>10.1f} {g:>10.1f} {a / g:>12.3f}")
dist.destroy_process_group()
