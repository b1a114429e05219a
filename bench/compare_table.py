#!/usr/bin/env python3
"""Merge the outputs of bench/compare.sh into one markdown table.

Rows: (op, N, bytes). Columns: median time of accord, OpenMPI and gloo (per-iteration max over
ranks; for accord and OpenMPI also the median over rounds), busbw, and the ratios
time(baseline) / time(accord): above 1 means accord is faster by that factor."""
import glob
import os
import re
import sys


def parse_accord(path):
    rows = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 9 and f[0].isdigit() and f[1].isdigit():
            rows[int(f[0])] = (float(f[5]), float(f[7]))
    return rows


def parse_baseline(path):
    """{(op, n): {bytes: (us, busbw)}} from benchcommon tables."""
    out, key = {}, None
    if not os.path.exists(path):
        return out
    for line in open(path):
        m = re.match(r"# (\w+) (\w+) n=(\d+)", line)
        if m:
            key = (m.group(2), int(m.group(3)))
            out.setdefault(key, {})
            continue
        f = line.split()
        if key and len(f) >= 6 and f[0].isdigit():
            out[key][int(f[0])] = (float(f[2]), float(f[5]))
    return out


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def main(d):
    """Files: accord-OP-N.rR.txt and mpi-N.rR.txt per round R, gloo-N.txt once."""
    rounds = {}  # (op, n) -> list of {bytes: (us, busbw)} per round, for accord and mpi
    mpi_rounds = {}
    for p in glob.glob(os.path.join(d, "mpi-*.txt")):
        r = os.path.basename(p).split(".")[-2]
        for key, rows in parse_baseline(p).items():
            mpi_rounds.setdefault(key, {})[r] = rows
    gloo = {}
    for p in glob.glob(os.path.join(d, "gloo-*.txt")):
        gloo.update(parse_baseline(p))
    for p in glob.glob(os.path.join(d, "accord-*.txt")):
        stem, r = os.path.basename(p)[len("accord-"):].rsplit(".", 2)[:2]
        op, n = stem.rsplit("-", 1)
        rounds.setdefault((op, int(n)), {})[r] = parse_accord(p)
    nr = max((len(v) for v in rounds.values()), default=0)
    print(f"Median over {nr} round(s); 'per round' is the range of the per-round ratios to OpenMPI.")
    print()
    print("| op | N | bytes | accord us | OpenMPI us | gloo us | accord busbw GB/s | OpenMPI busbw "
          "| x vs OpenMPI | per round | x vs gloo |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (op, n) in sorted(rounds, key=lambda k: (k[1], k[0])):
        acc = rounds[(op, n)]
        mpi = mpi_rounds.get((op, n), {})
        g = gloo.get((op, n), {})
        for b in sorted(set().union(*[set(x) for x in acc.values()])):
            t = median([x[b][0] for x in acc.values() if b in x])
            bw = median([x[b][1] for x in acc.values() if b in x])
            ms = [x[b][0] for x in mpi.values() if b in x]
            mbw = [x[b][1] for x in mpi.values() if b in x]
            per = [mpi[r][b][0] / acc[r][b][0] for r in acc
                   if r in mpi and b in mpi[r] and b in acc[r] and acc[r][b][0] > 0]
            m = median(ms) if ms else None
            cells = [
                f"{m:.1f}" if m is not None else "-",
                f"{g[b][0]:.1f}" if b in g else "-",
                f"{bw:.2f}",
                f"{median(mbw):.2f}" if mbw else "-",
                f"{m / t:.2f}" if m is not None and t > 0 else "-",
                f"{min(per):.2f}-{max(per):.2f}" if per else "-",
                f"{g[b][0] / t:.2f}" if b in g and t > 0 else "-",
            ]
            print(f"| {op} | {n} | {b} | {t:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
