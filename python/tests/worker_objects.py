"""One rank of the object-collective check (`accord run -n N python worker_objects.py`).

Objects of every shape (None, nested containers, numpy arrays, a 1 MiB bytes value, a class
instance) through broadcast_object, all_gather_object, gather_object, scatter_object_list and
send_object/recv_object, compared with what each rank knows the others sent (they derive it
from a shared seed); probe/iprobe sizing receives. Prints `OBJECTS-OK <rank>` at the end.
"""

import sys
import time
from dataclasses import dataclass

import numpy as np

import accord


@dataclass
class Point:
    x: int
    label: str


comm = accord.init(timeout=60)
n, me = comm.size, comm.rank


def obj(rank, salt):
    """Rank `rank`'s object number `salt`: a different shape for each salt."""
    rng = np.random.default_rng(1000 * rank + salt)
    shapes = [
        None,
        {"rank": rank, "vals": rng.integers(0, 100, 5).tolist(), "nested": [(1, 2.5), {"k": "v"}]},
        rng.standard_normal(int(rng.integers(0, 50))),
        bytes(rng.integers(0, 256, 1 << 20, dtype=np.uint8)),
        Point(rank, "p" * rank),
        "",
    ]
    return shapes[salt % len(shapes)]


def same(a, b):
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def check(what, got, want):
    if not same(got, want):
        print(f"FAIL rank {me} {what}: got {got!r:.200} want {want!r:.200}", flush=True)
        sys.exit(1)


for salt in range(6):
    for root in {0, n - 1, n // 2}:
        got = comm.broadcast_object(obj(root, salt) if me == root else "junk", root=root)
        check(f"broadcast_object salt {salt} root {root}", got, obj(root, salt))
        got = comm.gather_object(obj(me, salt), root=root)
        if me == root:
            for r in range(n):
                check(f"gather_object salt {salt} from {r}", got[r], obj(r, salt))
        elif got is not None:
            check("gather_object off the root", got, None)
        objs = [obj(r, salt + 1) for r in range(n)] if me == root else None
        check(f"scatter_object_list salt {salt}", comm.scatter_object_list(objs, root=root), obj(me, salt + 1))
    everyone = comm.all_gather_object(obj(me, salt))
    assert len(everyone) == n
    for r in range(n):
        check(f"all_gather_object salt {salt} from {r}", everyone[r], obj(r, salt))
    if n > 1:
        right, left = (me + 1) % n, (me - 1) % n
        # Even ranks send first, odd ranks receive first: no pair waits on each other.
        if me % 2 == 0:
            comm.send_object(obj(me, salt), right, tag=salt)
            got = comm.recv_object(left, tag=salt)
        else:
            got = comm.recv_object(left, tag=salt)
            comm.send_object(obj(me, salt), right, tag=salt)
        check(f"recv_object salt {salt}", got, obj(left, salt))

# Probing sizes a receive: what the next message from a rank with a tag holds.
if n > 1:
    if me == 0:
        comm.send(np.arange(5, dtype=np.float32), 1, tag=11)
        comm.send(np.arange(3, dtype=np.int64), 1, tag=11)
    elif me == 1:
        deadline = time.monotonic() + 30
        while (seen := comm.iprobe(0, tag=11)) is None and time.monotonic() < deadline:
            time.sleep(0.001)
        check("iprobe", seen, (5, "float32"))
        check("probe again", accord.probe(0, tag=11), (5, "float32"))
        count, dtype = seen
        got = comm.recv(np.empty(count, dtype), 0, tag=11)
        check("probed message", got, np.arange(5, dtype=np.float32))
        count, dtype = comm.probe(0, tag=11)
        check("next probed message", comm.recv(np.empty(count, dtype), 0, tag=11), np.arange(3, dtype=np.int64))
        check("nothing left", comm.iprobe(0, tag=11), None)

# The module-level forms use the default group.
check("accord.all_gather_object", accord.all_gather_object(me)[n - 1], n - 1)
# A root without one object per rank: every rank raises, none waits for data.
try:
    comm.scatter_object_list([1] * (n + 1) if me == 0 else None, root=0)
except ValueError as e:
    assert "one object per rank" in str(e), e
else:
    print(f"FAIL rank {me}: a list of the wrong length was scattered", flush=True)
    sys.exit(1)
try:
    comm.broadcast_object(1, root=n)
except ValueError as e:
    assert "root must be a rank" in str(e), e
else:
    print(f"FAIL rank {me}: root {n} was accepted", flush=True)
    sys.exit(1)
comm.barrier()
print(f"OBJECTS-OK {me}", flush=True)
