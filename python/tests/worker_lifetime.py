"""One rank of the lifetime check (`accord run -n N python worker_lifetime.py`, N >= 2).

init() twice is a clear error of this process; destroy() closes the world, and the peers that
still call into it are told that the rank closed its communicator at once, not at their
deadline. Prints `LIFETIME-OK <rank>` at the end.
"""

import sys
import time

import numpy as np

import accord

comm = accord.init(timeout=60)
n, me = comm.size, comm.rank
try:
    accord.init(timeout=60)
except RuntimeError as e:
    assert "already called in this process" in str(e), e
else:
    print(f"FAIL rank {me}: a second init() was accepted", flush=True)
    sys.exit(1)
x = np.ones(4, np.float32)
comm.allreduce(x)
assert (x == n).all()
if me == n - 1:
    accord.destroy()
    assert not accord.is_initialized()
    try:
        comm.allreduce(x)
    except ValueError as e:
        assert "was closed" in str(e), e
    else:
        print(f"FAIL rank {me}: a call after destroy() succeeded", flush=True)
        sys.exit(1)
else:
    t0 = time.monotonic()
    try:
        comm.allreduce(x)
    except (accord.PeerLostError, accord.AbortedError) as e:
        assert f"rank {n - 1} closed its communicator" in str(e), e
    else:
        print(f"FAIL rank {me}: an allreduce without rank {n - 1} succeeded", flush=True)
        sys.exit(1)
    took = time.monotonic() - t0
    assert took < 20, f"told after {took:.1f} s"
print(f"LIFETIME-OK {me}", flush=True)
