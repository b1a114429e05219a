"""One rank of the torch CPU tensor check (`accord run -n N python worker_torch.py`).

CPU tensors are read through torch's own accessors (address, element count, dtype), not a DLPack
export per call; everything that path does not take (a lazily negated view, a sparse or
non-contiguous tensor) goes the general way, with the same results or a clear refusal. Values
are random, from a seed shared by all ranks, and checked against a sequential reference.
Prints `TORCH-OK <rank>` at the end.
"""

import sys

import torch

import accord

comm = accord.init(timeout=60)
n, me = comm.size, comm.rank
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.int16, torch.complex64, torch.complex128]


def values(rank, dtype, count, salt=0):
    g = torch.Generator().manual_seed(104729 * rank + 31 * salt + count)
    lo = 0 if dtype in (torch.uint8, torch.bool) else -3
    x = torch.randint(lo, 4 if dtype != torch.bool else 2, (count,), generator=g)
    if dtype.is_complex:
        return torch.complex(x.double(), torch.randint(-3, 4, (count,), generator=g).double()).to(dtype)
    return x.to(dtype)


def check(what, got, want):
    if got.dtype != want.dtype or not torch.equal(got, want):
        print(f"FAIL rank {me} {what}: got {got.tolist()} want {want.tolist()}", flush=True)
        sys.exit(1)


for dtype in DTYPES:
    for count in (0, 1, 7, 1031):
        mine = [values(r, dtype, count) for r in range(n)]
        # Complex numbers have no order: they are summed instead (exactly: small integers).
        op = "sum" if dtype.is_complex else "max"
        stacked = torch.stack(mine)
        want = (stacked.sum(0) if dtype.is_complex else stacked.amax(0)) if count else mine[me].clone()
        x = mine[me].clone()
        assert comm.allreduce(x, op=op) is x
        check(f"allreduce {op} {dtype} x {count}", x, want)
        out = torch.zeros_like(x)
        assert comm.allreduce(mine[me], op=op, out=out) is out
        check(f"allreduce {op} out of place {dtype} x {count}", out, want)
        b = mine[me].clone()
        comm.broadcast(b, root=n - 1)
        check(f"broadcast {dtype} x {count}", b, mine[n - 1])
        g = torch.zeros(n * count, dtype=dtype)
        comm.allgather(mine[me], out=g)
        check(f"allgather {dtype} x {count}", g, torch.cat(mine))

# A parameter (a Tensor subclass) is reduced through its data; the tensor itself requires grad
# and is refused (written behind autograd's back, its gradients would be wrong), as torch's own
# DLPack export refuses it.
p = torch.nn.Parameter(values(me, torch.float32, 5, salt=1))
comm.allreduce(p.data, op="sum")
check("parameter sum", p.detach(), sum(values(r, torch.float32, 5, salt=1) for r in range(n)))
try:
    comm.allreduce(p, op="sum")
except (TypeError, ValueError) as e:
    assert "grad" in str(e), e
else:
    print(f"FAIL rank {me}: a tensor that requires grad was written in place", flush=True)
    sys.exit(1)

# A lazily negated view (as the imaginary part of a conjugate is) holds its values negated only
# in name: its memory holds them unnegated, and torch's DLPack export hands that memory over as
# it is. As an input it is sent with its true values; as an output it is refused.
neg = torch._neg_view(values(me, torch.float32, 4, salt=3))
assert neg.is_neg() and neg.is_contiguous()
out = torch.zeros(4)
comm.allreduce(neg, op="sum", out=out)
check("negated view", out, -sum(values(r, torch.float32, 4, salt=3) for r in range(n)))
try:
    comm.allreduce(neg, op="sum")
except ValueError as e:
    assert "lazily negated" in str(e), e
else:
    print(f"FAIL rank {me}: a negated view was written in place", flush=True)
    sys.exit(1)

# A lazily conjugated complex tensor likewise: resolved as input, refused as output.
z = values(me, torch.complex64, 4, salt=4)
out = torch.zeros_like(z)
comm.allreduce(z.conj(), op="sum", out=out)
check("conjugated view", out, sum(values(r, torch.complex64, 4, salt=4) for r in range(n)).conj())
try:
    comm.allreduce(z.conj(), op="sum")
except (TypeError, ValueError) as e:
    assert "lazily conjugated" in str(e), e
else:
    print(f"FAIL rank {me}: a conjugated view was written in place", flush=True)
    sys.exit(1)

# Not contiguous and sparse tensors are refused, the first naming the problem.
try:
    comm.allreduce(torch.zeros(4, 4)[:, 0])
except (TypeError, ValueError) as e:
    assert "contiguous" in str(e), e
else:
    print(f"FAIL rank {me}: a strided view was accepted", flush=True)
    sys.exit(1)
try:
    comm.allreduce(torch.zeros(3, 3).to_sparse())
except (TypeError, ValueError) as e:
    pass
else:
    print(f"FAIL rank {me}: a sparse tensor was accepted", flush=True)
    sys.exit(1)

comm.barrier()
print(f"TORCH-OK {me}", flush=True)
