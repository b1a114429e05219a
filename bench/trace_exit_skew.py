#!/usr/bin/env python3
"""How far apart Accord's calls release their ranks, from an `ACCORD_TRACE` timeline of one
machine (every rank on one clock): per job (the ranks' files of one run) and per call of the
world communicator, the latest end minus the earliest, over the ranks; prints the median, p10
and p90 in microseconds over the last two thirds of the calls (the first third warms up).
On a run of `accord bench barrier` these are the barrier's own exit spreads, the counterpart of
bench/barrier_skew.c for OpenMPI.

    python3 bench/trace_exit_skew.py TRACE_DIR [OP]      # OP: only calls of this kind (barrier)
"""
import collections
import glob
import json
import re
import statistics
import sys

folder, only = sys.argv[1], (sys.argv[2] if len(sys.argv) > 2 else None)
jobs = collections.defaultdict(dict)  # job -> rank -> seq -> (name, end)
for path in glob.glob(f"{folder}/*.json"):
    named = re.fullmatch(r"(.*)-rank(\d+)\.json", path)
    if not named:
        continue  # not one rank's timeline (a merged one, say)
    events = json.load(open(path))
    events = events["traceEvents"] if isinstance(events, dict) else events
    world = {
        e["tid"]
        for e in events
        if e["ph"] == "M" and e["name"] == "thread_name"
        and e["args"]["name"] == "communicator world"
    }
    jobs[named[1]][int(named[2])] = {
        e["args"]["seq"]: (e["name"], e["ts"] + e["dur"])
        for e in events
        if e["ph"] == "X" and e["tid"] in world and "engine" in e.get("args", {})
    }
for job, ranks in sorted(jobs.items()):
    seqs = sorted(set.intersection(*(set(calls) for calls in ranks.values())))
    seqs = seqs[len(seqs) // 3:]
    spread = sorted(
        max(ranks[r][q][1] for r in ranks) - min(ranks[r][q][1] for r in ranks)
        for q in seqs
        if only is None or ranks[min(ranks)][q][0] == only
    )
    if not spread:
        continue
    p = lambda f: spread[int(f * (len(spread) - 1))]
    print(f"{job.split('/')[-1]}: {len(ranks)} ranks, {len(spread)} calls, exit spread "
          f"median {statistics.median(spread):.1f} us, p10 {p(0.1):.1f}, p90 {p(0.9):.1f}")
