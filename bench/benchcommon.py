# Shared by bench/mpi_allreduce.py and bench/gloo_allreduce.py (bench/compare.sh).
"""Shared helpers for the CPU collective baselines (sizes, iteration policy, table output).

Conventions follow nccl-tests:
  allreduce : size = bytes of the (per-rank) buffer; busbw = algbw * 2(n-1)/n
  broadcast : size = bytes of the buffer;            busbw = algbw
  allgather : size = bytes of the gathered output;   busbw = algbw * (n-1)/n
algbw = size / time (GB/s, 1 GB = 1e9 bytes). Times are the per-iteration
maximum over ranks, then the median (and min) over timed iterations.
"""
import argparse
import statistics

MiB = 1 << 20


def parse_size(s):
    s = s.strip().upper()
    mult = 1
    for suf, m in (("KIB", 1 << 10), ("MIB", 1 << 20), ("GIB", 1 << 30),
                   ("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("B", 1)):
        if s.endswith(suf):
            mult = m
            s = s[: -len(suf)]
            break
    return int(float(s) * mult)


def sizes(min_bytes=4, max_bytes=64 * MiB, factor=4):
    out, b = [], min_bytes
    while b <= max_bytes:
        out.append(b)
        b *= factor
    return out


def common_args(p: argparse.ArgumentParser):
    p.add_argument("--min-bytes", default="4", type=parse_size)
    p.add_argument("--max-bytes", default="64M", type=parse_size)
    p.add_argument("--factor", default=4, type=int)
    p.add_argument("--ops", default="allreduce,broadcast,allgather",
                   help="comma list of allreduce,broadcast,allgather")
    p.add_argument("--budget", default=0.5, type=float,
                   help="target seconds of timed work per size (default 0.5)")
    p.add_argument("--warmup", default=5, type=int)
    p.add_argument("--min-iters", default=10, type=int)
    p.add_argument("--max-iters", default=2000, type=int)
    return p


def pick_iters(per_op_s, args):
    if per_op_s <= 0:
        return args.max_iters
    return int(max(args.min_iters, min(args.max_iters, args.budget / per_op_s)))


def bus_factor(op, n):
    if op == "allreduce":
        return 2.0 * (n - 1) / n
    if op == "allgather":
        return (n - 1) / n
    return 1.0


def summarize(op, n, nbytes, times_s):
    med = statistics.median(times_s)
    mn = min(times_s)
    algbw = nbytes / med / 1e9 if med > 0 else float("nan")
    return dict(op=op, n=n, bytes=nbytes, iters=len(times_s), median_us=med * 1e6,
                min_us=mn * 1e6, algbw=algbw, busbw=algbw * bus_factor(op, n))


HEADER = f"{'bytes':>10} {'iters':>6} {'median_us':>12} {'min_us':>12} {'algbw_GB/s':>11} {'busbw_GB/s':>11}"


def fmt_row(r):
    return (f"{r['bytes']:>10d} {r['iters']:>6d} {r['median_us']:>12.1f} {r['min_us']:>12.1f} "
            f"{r['algbw']:>11.3f} {r['busbw']:>11.3f}")


def print_table(title, rows):
    print(f"# {title}")
    print(HEADER)
    for r in rows:
        print(fmt_row(r))
    print(flush=True)
