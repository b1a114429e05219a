#!/usr/bin/env python3
"""Median time per size over rounds, and Accord's ratio to each peer, from bench/multihost.sh's
summary (blocks headed `## WHO OP round K`, rows as `accord bench` / mpicoll / gloo print them).
`accordb` is Accord under the ACCORD_B settings, compared like a peer."""
import statistics
import sys
from collections import defaultdict

times = defaultdict(list)  # (op, who, bytes) -> [us]
who = op = None
for line in open(sys.argv[1]):
    f = line.split()
    if line.startswith("## "):
        who, op = f[1], f[2]
    elif f and f[0].isdigit() and who:
        # accord: size count type redop root time ...; mpicoll and gloo: size time ...
        t = float(f[5] if who.startswith("accord") else f[1])
        times[(op, who, int(f[0]))].append(t)

ops = list(dict.fromkeys(k[0] for k in times))
peers = [p for p in ("accordb", "mpi", "gloo") if any(k[1] == p for k in times)]
for op in ops:
    print(f"\n### {op}\n")
    head = "| bytes | accord us | " + " | ".join(f"{p} us | accord/{p}" for p in peers) + " |"
    print(head)
    print("|" + "---|" * (2 + 2 * len(peers)))
    for b in sorted({k[2] for k in times if k[0] == op}):
        a = times.get((op, "accord", b))
        row = [str(b), f"{statistics.median(a):.1f}" if a else "-"]
        for p in peers:
            t = times.get((op, p, b))
            row.append(f"{statistics.median(t):.1f}" if t else "-")
            row.append(f"{statistics.median(a) / statistics.median(t):.2f}" if a and t else "-")
        print("| " + " | ".join(row) + " |")
