"""Rank program for test_observe.py: records, counters and dumps as a user sees them.

argv[1]: `record` (a few calls, then check this rank's flight record and counters) or
`wrong-root` (the last rank broadcasts from another root than the others: a desync).
"""

import os
import sys

import numpy as np

import accord

mode = sys.argv[1]
comm = accord.init()
me, n = comm.rank, comm.size
x = np.ones(8, dtype=np.float32)
for _ in range(3):
    comm.allreduce(x)
comm.broadcast(x, root=0)
if mode == "record":
    if me == 0:
        comm.send(np.arange(4, dtype=np.int64), dst=n - 1, tag=5)
    if me == n - 1:
        comm.recv(np.empty(4, dtype=np.int64), src=0, tag=5)
    rec = comm.flight_record()
    host = [r for r in rec["records"] if r["lane"] == "host"]
    assert [r["op"] for r in host] == ["allreduce"] * 3 + ["broadcast"], host
    assert [r["seq"] for r in host] == [0, 1, 2, 3], host
    assert all(r["state"] == "completed" and r["dtype"] == "f32" and r["count"] == 8 for r in host), host
    assert host[0]["reduce"] == "sum" and host[3]["root"] == 0, host
    assert all(r["engine"] for r in host), host
    assert all(r["end_us"] >= r["start_us"] > 1.6e15 for r in host), host
    p2p = [r for r in rec["records"] if r["lane"] == "p2p"]
    if me == 0:
        assert [(r["op"], r["peer"], r["tag"], r["count"]) for r in p2p] == [("send", n - 1, 5, 4)], p2p
    elif me == n - 1:
        assert [(r["op"], r["peer"], r["tag"]) for r in p2p] == [("recv", 0, 5)], p2p
    else:
        assert p2p == [], p2p
    m = comm.metrics()
    assert m["host_ops"] == 4 and m["errors"] == 0, m
    assert m["p2p_ops"] == (1 if me in (0, n - 1) else 0), m
    assert m["bytes"] == 4 * 32 + (32 if me in (0, n - 1) else 0), m
    assert rec["rank"] == me and rec["size"] == n and rec["error"] is None, rec
    files = accord.dump_flight_records()
    assert len(files) == 1 and files[0].endswith(f"-rank{me}.json"), files
    print(f"rank {me}: record ok")
else:
    try:
        comm.broadcast(x, root=1 if me == n - 1 else 0)
    except accord.DesyncError as e:
        print(f"rank {me}: desync: {e}")
        assert comm.metrics()["errors"] == 1
    except accord.AbortedError as e:
        print(f"rank {me}: aborted: {e}")
    sys.exit(3)
