#!/usr/bin/env python3
"""Summarise bench/gpu_engines.sh: per op and size, the median time (us) of each side over the
rounds, Accord's wrong-result count, and the ratios of Accord's `auto` engine to NCCL.

Usage: bench/gpu_engines.py OUTDIR
"""
import collections
import glob
import json
import os
import statistics
import sys

# nccl-tests prints out-of-place then in-place columns; Accord's benchmark runs allreduce and
# broadcast in place (as torch does) and the others out of place.
IN_PLACE = {"allreduce", "broadcast"}


def accord_rows(path):
    rows = json.load(open(path))["rows"]
    return {r["bytes"]: (r["time_us"], r["wrong"]) for r in rows}


def nccl_tests_rows(path, op):
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) < 13 or not f[0].isdigit():
            continue
        # size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
        t_out, w_out, t_in, w_in = f[5], f[8], f[9], f[12]
        t, w = (t_in, w_in) if op in IN_PLACE else (t_out, w_out)
        try:
            out[int(f[0])] = (float(t), int(w) if w.isdigit() else 0)
        except ValueError:
            pass
    return out


def main(out):
    data = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    wrong = collections.Counter()
    for path in glob.glob(os.path.join(out, "*.*.*")):
        name = os.path.basename(path)
        op, side, rest = name.split(".", 2)
        if side.startswith("nccl-tests") and rest.endswith(".txt"):
            rows = nccl_tests_rows(path, op)
        elif not side.startswith("nccl-tests") and rest.endswith(".json"):
            rows = accord_rows(path)
        else:
            continue
        for size, (t, w) in rows.items():
            data[op][size][side].append(t)
            wrong[(op, side)] += w
    sides = ["nccl-tests", "nccl-tests-R2", "nccl", "accord", "auto"]
    for op in sorted(data):
        present = [s for s in sides if any(s in data[op][z] for z in data[op])]
        print(f"\n## {op} (median us over rounds; ratio < 1: auto faster)\n")
        head = "| bytes | " + " | ".join(present) + " |"
        ref = [s for s in ("nccl-tests", "nccl-tests-R2", "nccl") if s in present]
        head += "".join(f" auto/{s} |" for s in ref)
        print(head)
        print("|" + "---|" * (1 + len(present) + len(ref)))
        for size in sorted(data[op]):
            med = {s: statistics.median(v) for s, v in data[op][size].items() if v}
            cells = [f"{med[s]:.2f}" if s in med else "" for s in present]
            ratios = [
                f"{med['auto'] / med[s]:.2f}" if "auto" in med and s in med else "" for s in ref
            ]
            print(f"| {size} | " + " | ".join(cells) + " |" + "".join(f" {x} |" for x in ratios))
        bad = {s: wrong[(op, s)] for s in present if wrong[(op, s)]}
        print(f"\n#wrong: {bad if bad else 0}")


if __name__ == "__main__":
    main(sys.argv[1])
