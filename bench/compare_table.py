#!/usr/bin/env python3
"""Merge the outputs of bench/compare.sh into one markdown table.

Rows: (op, N, bytes). Columns: median time of accord, OpenMPI and gloo (per-iteration max over
ranks; for accord and OpenMPI also the median over rounds), busbw, and the ratios
time(baseline) / time(accord): above 1 means accord is faster by that factor.

Rows whose buffers are far larger than the last-level cache also get a memory floor: the bytes
every rank must read and write (broadcast: the source once and n-1 destinations; allgather:
the inputs once and n outputs; allreduce: n inputs and n outputs) at the copy bandwidth that
`accord bench copy` measured in the same run. No implementation can beat it, so
"OpenMPI / floor" is the most any library could be faster than OpenMPI in that row."""
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


def traffic(op, n, size):
    """Bytes that must move to or from memory for one call, per the module docstring."""
    return {"broadcast": n, "allgather": n + 1, "allreduce": 2 * n}.get(op, 0) * size


def machine(d):
    """(copy bandwidth in GB/s or None, last-level cache bytes, probes, two-rank barrier us
    per probe) of a run."""
    probes = [parse_accord(p) for p in sorted(glob.glob(os.path.join(d, "probe.*.txt")))]
    bws = [p[64 << 20][1] for p in probes if 64 << 20 in p]
    barriers = [p[4][0] for p in probes if 4 in p]
    llc = 32 << 20
    path = os.path.join(d, "machine.txt")
    if os.path.exists(path):
        m = re.search(r"last-level cache: (\d+)([KM]?)", open(path).read())
        if m:
            llc = int(m.group(1)) << {"": 0, "K": 10, "M": 20}[m.group(2)]
    return (median(bws) if bws else None), llc, len(bws), barriers


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
    copy_bw, llc, nbw, barriers = machine(d)
    print(f"Median over {nr} round(s); 'per round' is the range of the per-round ratios to OpenMPI.")
    if copy_bw:
        print(f"Memory floor at {copy_bw:.1f} GB/s copy bandwidth (`accord bench copy --sizes 64M`, "
              f"median of {nbw}), for rows moving at least 4x the {llc >> 20} MiB last-level cache.")
    if barriers:
        print("Two-rank barrier before each round (core-to-core state): "
              + ", ".join(f"{b:.2f}" for b in barriers) + " us.")
    print()
    print("| op | N | bytes | accord us | OpenMPI us | gloo us | accord busbw GB/s | OpenMPI busbw "
          "| x vs OpenMPI | per round | x vs gloo | floor us | OpenMPI / floor |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
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
            moved = traffic(op, n, b)
            floor = moved / (copy_bw * 1e3) if copy_bw and moved >= 4 * llc else None
            cells += [
                f"{floor:.1f}" if floor else "-",
                f"{m / floor:.2f}" if floor and m is not None else "-",
            ]
            print(f"| {op} | {n} | {b} | {t:.1f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
