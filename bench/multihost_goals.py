#!/usr/bin/env python3
"""Where tables of `bench/multihost.sh bench` stand against the multi-host goals: rows slower
than OpenMPI; rows from 64 KiB taking more than 0.8 of gloo's time; rows up to 16 KiB not 10x
faster than gloo.

    python3 bench/multihost_goals.py OUT/table.md [...]
"""
import re
import sys

for path in sys.argv[1:]:
    op, header, rows, above, gloo_large, gloo_small = None, [], 0, [], [], []
    with open(path) as f:
        head = f.readline().split("; results")[0].strip()
        for line in f:
            m = re.match(r"### (\w+)", line)
            if m:
                op = m.group(1)
                continue
            if line.startswith("| bytes"):
                header = [c.strip() for c in line.strip("|\n").split("|")]
                continue
            if not line.startswith("| "):
                continue
            cols = dict(zip(header, (c.strip() for c in line.strip("|\n").split("|"))))
            if "accord/mpi" not in cols:
                continue
            rows += 1
            b, mpi, gloo = int(cols["bytes"]), float(cols["accord/mpi"]), cols.get("accord/gloo")
            if mpi > 1.0:
                above.append(f"{op} {b} {mpi:.2f}")
            if gloo and b >= 64 << 10 and float(gloo) > 0.8:
                gloo_large.append(f"{op} {b} {float(gloo):.2f}")
            if gloo and b <= 16 << 10 and float(gloo) > 0.1:
                gloo_small.append(f"{op} {b} {float(gloo):.2f}")
        print(head)
        print(f"  {rows} rows; slower than OpenMPI in {len(above)}: " + "; ".join(above))
        print("  from 64 KiB, above 0.8x gloo's time: " + "; ".join(gloo_large))
        print("  up to 16 KiB, not 10x faster than gloo: " + "; ".join(gloo_small))
