#!/usr/bin/env python3
"""The table of bench/fft.sh: reads OUT/<side>-P<p>.r<round>.json (one JSON line each, from
bench/fft_accord.py, bench/fft_mpi4py.py, bench/fft_numpy.py; a launcher's "[rank]" prefix is
skipped) and prints, per P and direction, each side's median over rounds of its per-run median,
the ratio accord / mpi4py-fft of those medians (below 1: accord faster) with the per-round
ratios beside it, and mpi4py-fft against single-process numpy.

    python3 bench/fft_table.py OUT
"""
import collections
import glob
import json
import os
import re
import statistics as st
import sys

out = sys.argv[1]
runs = collections.defaultdict(dict)  # (side, P) -> round -> record
failed = []
for path in sorted(glob.glob(os.path.join(out, "*.json"))):
    m = re.match(r"(\w+)-P(\d+)\.r(\d+)\.json$", os.path.basename(path))
    if not m:
        continue
    side, p, rnd = m.group(1), int(m.group(2)), int(m.group(3))
    rec = None
    for line in open(path):
        i = line.find('{"impl"')
        if i >= 0:
            rec = json.loads(line[i:])
            break
    if rec is None or "error" in rec:
        why, err = "no output", path[:-5] + ".err"
        if rec is not None:
            why = rec["error"]
        elif os.path.exists(err):
            why = next((ln.strip() for ln in open(err) if ln.strip()), why)
        failed.append(f"{side} P={p} round {rnd}: {why}")
        continue
    runs[(side, p)][rnd] = rec

if not runs:
    print("no results in", out)
    for f in failed:
        print("-", f)
    sys.exit(1)

any_rec = next(iter(next(iter(runs.values())).values()))
shape, dtype = any_rec["shape"], any_rec["dtype"]
ps = sorted({p for (side, p) in runs if side != "numpy"})
rounds = sorted({r for v in runs.values() for r in v})
numpy_runs = runs.get(("numpy", 1), {})


def med(side, p, key):
    vals = [rec[key] for rec in runs.get((side, p), {}).values() if key in rec]
    return st.median(vals) if vals else None


def ms(x):
    return "-" if x is None else f"{x * 1e3:.2f}"


def per_round(p, key):
    a, m = runs.get(("accord", p), {}), runs.get(("mpi4py", p), {})
    return [a[r][key] / m[r][key] for r in rounds if r in a and r in m and key in a[r] and key in m[r]]


print(f"3-D complex FFT, global shape {'x'.join(map(str, shape))}, {dtype}; "
      f"median over {len(rounds)} round(s) of each run's median (ms). "
      f"accord / mpi4py-fft: ratio of the medians, below 1 = accord faster; 'per round': the "
      f"ratio in each round. numpy: one process, the whole array, same in every row.")
grids = sorted({tuple(rec.get("grid", [])) for (side, p), v in runs.items() if side == "mpi4py"
                for rec in v.values()})
backends = sorted({rec.get("backend", "?") for (side, p), v in runs.items() if side == "mpi4py"
                   for rec in v.values()})
if grids:
    print(f"mpi4py-fft: backend {', '.join(backends)}, process grids "
          f"{', '.join('x'.join(map(str, g)) for g in grids)}; 'forward, plan arrays' is "
          f"fft.forward() on the plan's own arrays, without the copies in and out of "
          f"fft.forward(u, uh).")
ncpu = os.cpu_count()
if any(p > ncpu for p in ps):
    print(f"This machine has {ncpu} CPUs: P > {ncpu} is oversubscribed (ranks share cores).")
busy_path = os.path.join(out, "busy.txt")
if os.path.exists(busy_path):
    rows = [line.split() for line in open(busy_path) if len(line.split()) >= 2]
    before = [float(r[1]) for r in rows]
    during = [float(r[2]) for r in rows if len(r) >= 3]
    if rows:
        print(f"Share of the {ncpu} CPUs busy with other work, before each round (1 s): "
              f"{', '.join(f'{x:.0%}' for x in before)}"
              + (f"; during each round: {', '.join(f'{x:.0%}' for x in during)}" if during else "")
              + (" (the numbers carry it)." if max(before + during) > 0.05 else "."))
print()
print("| P | direction | accord ms | mpi4py-fft ms | numpy ms | accord / mpi4py-fft | per round "
      "| numpy / mpi4py-fft |")
print("|---|---|---|---|---|---|---|---|")
all_ratios = []
for p in ps:
    for label, key in (("forward", "forward_s"), ("backward", "backward_s"),
                       ("forward, plan arrays", "forward_planned_s")):
        a, m = med("accord", p, key), med("mpi4py", p, key)
        n = med("numpy", 1, key)
        if a is None and m is None:
            continue
        rr = per_round(p, key)
        if key != "forward_planned_s":
            all_ratios += rr
        ratio = f"{a / m:.3f}" if a is not None and m is not None else "-"
        rounds_s = " ".join(f"{x:.2f}" for x in rr) if rr else "-"
        speed = f"{n / m:.2f}" if n is not None and m is not None else "-"
        print(f"| {p} | {label} | {ms(a)} | {ms(m)} | {ms(n)} | {ratio} | {rounds_s} | {speed} |")
print()
if all_ratios:
    print(f"Overall accord / mpi4py-fft (forward and backward, every P and round): median "
          f"{st.median(all_ratios):.3f}, range {min(all_ratios):.3f}-{max(all_ratios):.3f} "
          f"over {len(all_ratios)} paired runs.")
else:
    print("Overall accord / mpi4py-fft: no paired runs (a side was skipped or failed).")
if failed:
    print()
    print("Runs without a result:")
    for f in failed:
        print("-", f)
