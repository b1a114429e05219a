#!/usr/bin/env python3
"""Merge the outputs of bench/compare.sh into one markdown table.

Rows: (op, N, bytes). Columns: median time of accord, OpenMPI and gloo (per-iteration max over
ranks), accord's busbw, and the ratios time(baseline) / time(accord): above 1 means accord is
faster by that factor."""
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


def main(d):
    mpi, gloo = {}, {}
    for p in glob.glob(os.path.join(d, "mpi-*.txt")):
        mpi.update(parse_baseline(p))
    for p in glob.glob(os.path.join(d, "gloo-*.txt")):
        gloo.update(parse_baseline(p))
    print("| op | N | bytes | accord us | OpenMPI us | gloo us | accord busbw GB/s | OpenMPI busbw | x vs OpenMPI | x vs gloo |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    files = sorted(glob.glob(os.path.join(d, "accord-*.txt")),
                   key=lambda p: (int(p.rsplit("-", 1)[1][:-4]), p))
    for p in files:
        op, n = os.path.basename(p)[len("accord-"):-4].rsplit("-", 1)
        n = int(n)
        acc = parse_accord(p)
        m, g = mpi.get((op, n), {}), gloo.get((op, n), {})
        for b in sorted(acc):
            t, bw = acc[b]

            def cell(x, i):
                return f"{x[b][i]:.1f}" if b in x else "-"

            def ratio(x):
                return f"{x[b][0] / t:.2f}" if b in x and t > 0 else "-"
            mbw = f"{m[b][1]:.2f}" if b in m else "-"
            print(f"| {op} | {n} | {b} | {t:.1f} | {cell(m, 0)} | {cell(g, 0)} | {bw:.2f} | {mbw} | {ratio(m)} | {ratio(g)} |")


if __name__ == "__main__":
    main(sys.argv[1])
