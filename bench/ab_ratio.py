#!/usr/bin/env python3
"""Summarise bench/ab_host.sh output: per row the median time of each binary over the rounds,
their ratio new/old and the median of the per-round ratios; then the rows above a threshold."""
import collections
import statistics as st
import sys

path = sys.argv[1]
limit = float(sys.argv[2]) if len(sys.argv) > 2 else 1.05
rows = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(path):
    rnd, which, op, transport, size, us = line.split()
    rows[(op, transport, int(size))][which].append(float(us))
table = []
for key, v in sorted(rows.items()):
    if not v["old"] or not v["new"]:
        continue
    old, new = st.median(v["old"]), st.median(v["new"])
    paired = st.median(n / o for n, o in zip(v["new"], v["old"]) if o > 0)
    table.append((key, old, new, new / old, paired, len(v["old"])))
print(f"{len(table)} rows; median ratio new/old {st.median(t[3] for t in table):.3f}")
slow = [t for t in table if t[3] > limit]
print(f"rows slower than {limit}: {len(slow)}; faster than {2 - limit:.2f}: "
      f"{sum(t[3] < 2 - limit for t in table)}")
for (op, tr, size), old, new, ratio, paired, n in sorted(slow, key=lambda t: -t[3]):
    print(f"  {op:15} {tr:5} {size:>9} B  old {old:9.2f} us  new {new:9.2f} us  "
          f"ratio {ratio:.3f}  per-round median {paired:.3f}  ({n} rounds)")
