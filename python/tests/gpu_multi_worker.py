"""One rank of test_gpu_multi_tensor_calls: Ray's multi-GPU semantics (accord._multi, what
backend "accord" and accord.collective's *_multigpu run) with one torch tensor on each of two
GPUs per process, in opposite orders on the two ranks (so each stages on a GPU of its own),
and messages addressed to GPU indices."""

import torch

import accord
from accord import _multi

comm = accord.init()
rank, n, k = comm.rank, comm.size, 2
devs = [f"cuda:{(rank + i) % k}" for i in range(k)]
val = lambda r, i: float(10 * r + i + 1)  # noqa: E731
every = [val(r, i) for r in range(n) for i in range(k)]


def tensors(shape=3, dtype=torch.float64):
    return [torch.full((shape,), val(rank, i), dtype=dtype, device=d) for i, d in enumerate(devs)]


ts = tensors()
_multi.allreduce(comm, ts, "sum")
assert all(t.tolist() == [sum(every)] * 3 and str(t.device) == d for t, d in zip(ts, devs)), ts

ts = tensors()
_multi.reduce(comm, ts, "max", n - 1, k - 1)
want = [[val(rank, i)] * 3 for i in range(k)]
if rank == n - 1:
    want[k - 1] = [max(every)] * 3
assert [t.tolist() for t in ts] == want, ts

ts = tensors(2, torch.int64)
_multi.broadcast(comm, ts, n - 1, k - 1)
assert [t.tolist() for t in ts] == [[int(val(n - 1, k - 1))] * 2] * k, ts

lists = [[torch.zeros(2, device=d) for _ in range(n * k)] for d in devs]
_multi.allgather(comm, lists, tensors(2, torch.float32))
assert [[e.tolist() for e in lst] for lst in lists] == [[[v] * 2 for v in every]] * k, lists

ins = [[torch.full((2,), 100.0 * rank + 10 * i + e, device=d) for e in range(n * k)] for i, d in enumerate(devs)]
outs = [torch.zeros(2, device=d) for d in devs]
_multi.reducescatter(comm, outs, ins, "sum")
want = [[float(sum(100 * r + 10 * j + (rank * k + i) for r in range(n) for j in range(k)))] * 2 for i in range(k)]
assert [t.tolist() for t in outs] == want, outs

# Messages addressed by GPU index: rank 0 sends from its cuda:1 to GPU 0 of rank 1, then from
# cuda:0 to GPU 0; rank 1 receives them in the other order.
if rank == 0:
    _multi.send(comm, torch.full((4,), 7.0, device="cuda:1"), 1, 0, 0)
    _multi.send(comm, torch.full((4,), 5.0, device="cuda:0"), 1, 0, 3)
elif rank == 1:
    a = torch.full((4,), -1.0, device="cuda:0")
    b = torch.full((4,), -1.0, device="cuda:0")
    _multi.recv(comm, a, 0, 0, 3)
    _multi.recv(comm, b, 0, 1, 0)
    assert a.tolist() == [5.0, 5.0, 5.0, -1.0] and b.tolist() == [7.0] * 4, (a, b)
torch.cuda.synchronize()
comm.barrier()
print(f"GPU-MULTI-OK {rank}", flush=True)
