"""One rank of test_torch_backend.py: torch.distributed with backend "accord" (registered by
the package's entry point: this file never imports accord.torch), under `accord run`'s
torchrun-style environment (a torch too old for entry points gets it by import).
argv[1]: ops | ddp | split | cuda | desync | kill; argv[2] (optional): init_method | store."""

import os
import sys
import time

import torch
import torch.distributed as dist

if not hasattr(dist.Backend, "_ensure_backend_registered"):
    import accord.torch  # noqa: F401  (a torch without backend entry points: register by import)
mode = sys.argv[1]
if len(sys.argv) > 2 and sys.argv[2] == "init_method":
    # An explicit init_method, rank and world size (not the environment's).
    url = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    dist.init_process_group("accord", init_method=url, rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
elif len(sys.argv) > 2 and sys.argv[2] == "store":
    # A store the program made itself.
    r, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), w, r == 0)
    dist.init_process_group("accord", store=store, rank=r, world_size=w)
else:
    dist.init_process_group("accord")
rank, n = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == "accord"
# No timeout given to init_process_group: ACCORD_TIMEOUT (the launcher's tests set it) wins
# over torch's 30-minute default.
if os.environ.get("ACCORD_TIMEOUT"):
    assert dist.group.WORLD.communicator.timeout == float(os.environ["ACCORD_TIMEOUT"])


class spy_coalescing:
    """Records the devices torch starts coalescing batches on, on the default group, while
    open: whether this torch's batch_isend_irecv coalesces this backend's batches (2.11 calls
    the messages one by one instead)."""

    def __enter__(self):
        pg = dist.group.WORLD
        self.starts, original = [], pg._start_coalescing

        def start(device):
            self.starts.append(device)
            return original(device)

        pg._start_coalescing = start
        return self.starts

    def __exit__(self, *exc):
        del dist.group.WORLD._start_coalescing


def val(r, shape=(3,), dtype=torch.float32):
    return torch.full(shape, float(r + 1), dtype=dtype)


def ops():
    total = n * (n + 1) / 2
    for op, want in ((dist.ReduceOp.SUM, total), (dist.ReduceOp.PRODUCT, float(torch.arange(1, n + 1).prod())),
                     (dist.ReduceOp.MIN, 1.0), (dist.ReduceOp.MAX, float(n)), (dist.ReduceOp.AVG, total / n)):
        t = val(rank)
        dist.all_reduce(t, op=op)
        assert torch.allclose(t, torch.full((3,), want)), (op, t)
    for op, want in ((dist.ReduceOp.BAND, 0 if n > 1 else 1), (dist.ReduceOp.BOR, 0)):
        b = torch.tensor([rank + 1, 0], dtype=torch.int64)
        dist.all_reduce(b, op=op)
        if op == dist.ReduceOp.BOR:
            want = 0
            for r in range(n):
                want |= r + 1
        else:
            want = 1
            for r in range(n):
                want &= r + 1
        assert b.tolist() == [want, 0], (op, b)
    x = torch.tensor([rank], dtype=torch.int32)
    dist.all_reduce(x, op=dist.ReduceOp.BXOR)
    want = 0
    for r in range(n):
        want ^= r
    assert x.item() == want
    # async_op: a Work with wait / is_completed / get_future.
    t = val(rank)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    assert work.wait(timeout=__import__("datetime").timedelta(seconds=60))
    assert work.is_completed()
    assert torch.equal(fut.wait()[0], torch.full((3,), total))
    b = val(rank, (2, 2), torch.float64)
    dist.broadcast(b, src=n - 1)
    assert torch.equal(b, val(n - 1, (2, 2), torch.float64))
    r = val(rank)
    dist.reduce(r, dst=0, op=dist.ReduceOp.MAX)
    assert torch.equal(r, torch.full((3,), float(n)) if rank == 0 else val(rank))
    lst = [torch.zeros(3) for _ in range(n)]
    dist.all_gather(lst, val(rank))
    assert all(torch.equal(lst[q], val(q)) for q in range(n))
    out = torch.zeros(n * 3)
    dist.all_gather_into_tensor(out, val(rank))
    assert torch.equal(out, torch.cat([val(q) for q in range(n)]))
    g = [torch.zeros(3) for _ in range(n)] if rank == 0 else None
    dist.gather(val(rank), g, dst=0)
    if rank == 0:
        assert all(torch.equal(g[q], val(q)) for q in range(n))
    s = torch.zeros(3)
    dist.scatter(s, [val(q * 10) for q in range(n)] if rank == n - 1 else None, src=n - 1)
    assert torch.equal(s, val(rank * 10))
    rs = torch.zeros(2)
    dist.reduce_scatter(rs, [torch.full((2,), float(q + rank)) for q in range(n)])
    assert torch.equal(rs, torch.full((2,), float(sum(rank + q for q in range(n)))))
    rst = torch.zeros(2)
    dist.reduce_scatter_tensor(rst, torch.cat([torch.full((2,), float(q)) for q in range(n)]))
    assert torch.equal(rst, torch.full((2,), float(rank * n)))
    # torch's coalescing manager batches all_gather_into_tensor and reduce_scatter_tensor
    # calls into one call of the backend each (its fast path).
    from torch.distributed.distributed_c10d import _coalescing_manager as coalescing

    outs_ = [torch.zeros(n * 3), torch.zeros(n, 2, dtype=torch.float32)]
    with coalescing(async_ops=True) as cm:
        dist.all_gather_into_tensor(outs_[0], val(rank))
        dist.all_gather_into_tensor(outs_[1], torch.full((1, 2), float(rank)))
    cm.wait()
    assert torch.equal(outs_[0], torch.cat([val(q) for q in range(n)])), outs_[0]
    assert torch.equal(outs_[1], torch.stack([torch.full((2,), float(q)) for q in range(n)])), outs_[1]
    rss = [torch.zeros(2), torch.zeros(3)]
    with coalescing(async_ops=True) as cm:
        dist.reduce_scatter_tensor(rss[0], torch.cat([torch.full((2,), float(q)) for q in range(n)]))
        dist.reduce_scatter_tensor(rss[1], torch.arange(3 * n, dtype=torch.float32) + rank)
    cm.wait()
    assert torch.equal(rss[0], torch.full((2,), float(rank * n))), rss[0]
    want = torch.arange(3 * rank, 3 * rank + 3, dtype=torch.float32) * n + sum(range(n))
    assert torch.equal(rss[1], want), (rss[1], want)
    # all_to_all with per-rank sizes: rank r sends q + 1 values r to rank q.
    ins = [torch.full((q + 1,), float(rank)) for q in range(n)]
    outs = [torch.zeros(rank + 1) for _ in range(n)]
    dist.all_to_all(outs, ins)
    assert all(torch.equal(outs[q], torch.full((rank + 1,), float(q))) for q in range(n))
    # all_to_all_single with split sizes along dim 0 (rows of 2).
    in_splits = [q + 1 for q in range(n)]
    out_splits = [rank + 1] * n
    inp = torch.cat([torch.full((q + 1, 2), float(10 * rank + q)) for q in range(n)])
    outp = torch.zeros(sum(out_splits), 2)
    dist.all_to_all_single(outp, inp, out_splits, in_splits)
    assert torch.equal(outp, torch.cat([torch.full((rank + 1, 2), float(10 * q + rank)) for q in range(n)]))
    eq = torch.zeros(n * 2)
    dist.all_to_all_single(eq, torch.arange(n * 2, dtype=torch.float32) + 100 * rank)
    assert eq.tolist() == [float(100 * q + 2 * rank + i) for q in range(n) for i in range(2)]
    # Messages: blocking, nonblocking, batched (receives posted before sends).
    if n > 1:
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        got = torch.zeros(4)
        ops_ = [dist.P2POp(dist.irecv, got, prv, tag=3), dist.P2POp(dist.isend, torch.full((4,), float(rank)), nxt, tag=3)]
        with spy_coalescing() as starts:
            works = dist.batch_isend_irecv(ops_)
        # Coalesced (one Work for the batch, as NCCL's) where torch coalesces this group.
        assert len(works) == (1 if starts else 2), (works, starts)
        for w in works:
            w.wait()
        assert torch.equal(got, torch.full((4,), float(prv)))
        # A batch whose body raised (torch's coalescing manager then never ends it) leaves
        # nothing open: the next batch and collective run.
        from torch.distributed.distributed_c10d import _coalescing_manager

        try:
            with _coalescing_manager(dist.group.WORLD, torch.device("cpu"), async_ops=True):
                raise KeyError("inside the batch")
        except KeyError:
            pass
        got = torch.zeros(4)
        with _coalescing_manager(dist.group.WORLD, torch.device("cpu"), async_ops=True) as cm:
            dist.irecv(got, prv, tag=4)
            dist.isend(torch.full((4,), float(rank)), nxt, tag=4)
        assert len(cm.works) == 1, cm.works
        cm.works[0].wait()
        assert torch.equal(got, torch.full((4,), float(prv))), got
        # Where torch posts a batch's messages one by one (a backend without coalescing), the
        # backend sees that they come from batch_isend_irecv (CUDA ones then go through host
        # memory), and that a plain isend does not.
        import accord.torch as at

        pg, seen = dist.group.WORLD, []
        send = pg.send
        pg.send = lambda *a: (seen.append(at._in_torch_batch()), send(*a))[1]
        pg.supports_coalescing = False
        try:
            got = torch.zeros(4)
            works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, torch.full((4,), float(rank)), nxt)])
            assert len(works) == 2, works
            for w in works:
                w.wait()
            assert torch.equal(got, torch.full((4,), float(prv))), got
            w = dist.irecv(got, prv)
            dist.isend(torch.full((4,), float(rank + 1)), nxt).wait()
            w.wait()
            assert torch.equal(got, torch.full((4,), float(prv + 1))), got
        finally:
            del pg.send, pg.supports_coalescing
        assert seen == [True, False], seen
        if rank == 0:
            dist.send(torch.arange(5.0), 1)
            req = dist.isend(torch.arange(5.0) * 2, 1, tag=7)
            req.wait()
        elif rank == 1:
            a, b = torch.zeros(5), torch.zeros(5)
            req = dist.irecv(b, 0, tag=7)
            dist.recv(a, 0)
            req.wait()
            assert torch.equal(a, torch.arange(5.0)) and torch.equal(b, torch.arange(5.0) * 2)
    # Groups: a group of the even ranks.
    evens = list(range(0, n, 2))
    sub = dist.new_group(evens)
    if rank in evens:
        t = torch.tensor([float(rank)])
        dist.all_reduce(t, group=sub)
        assert t.item() == float(sum(evens))
    dist.barrier()
    # Objects ride on the same calls.
    objs = [None] * n
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": q} for q in range(n)]


def split():
    """split_group: two disjoint groups (one in reverse order) and ranks left out."""
    import accord

    # Launch groups without a GPU only count their depth; an end without a start is an error.
    with accord.group():
        with accord.group():
            pass
    try:
        accord._native.group_end()
    except accord.InvalidArgumentError as e:
        assert "group_start" in str(e), e
    else:
        raise AssertionError("group_end without group_start was not an error")
    first = list(range(0, n, 2))[::-1]        # the even ranks, highest first
    second = list(range(1, n, 2))[: max(1, (n - 1) // 2)]  # some odd ranks; the last odd one is out when n >= 4
    g = dist.split_group(split_ranks=[first, second], timeout=__import__("datetime").timedelta(seconds=60))
    mine = first if rank in first else second if rank in second else None
    if mine is None:
        assert g is None or g == dist.GroupMember.NON_GROUP_MEMBER, g
        print(f"rank {rank}: in no split group", flush=True)
    else:
        assert g is not None and g != dist.GroupMember.NON_GROUP_MEMBER, g
        assert dist.get_rank(g) == mine.index(rank), (dist.get_rank(g), mine)
        assert dist.get_world_size(g) == len(mine)
        assert dist.get_process_group_ranks(g) == mine, dist.get_process_group_ranks(g)
        assert dist.get_backend(g) == "accord"
        assert g.communicator.timeout == 60.0, g.communicator.timeout
        t = torch.full((3,), float(rank))
        dist.all_reduce(t, group=g)
        assert t.tolist() == [float(sum(mine))] * 3, (t, mine)
        b = torch.full((2,), float(rank))
        dist.broadcast(b, group_src=len(mine) - 1, group=g)
        assert b.tolist() == [float(mine[-1])] * 2, b
        out = [torch.zeros(1) for _ in mine]
        dist.all_gather(out, torch.tensor([float(rank)]), group=g)
        assert [o.item() for o in out] == [float(q) for q in mine], out
        objs = [None] * len(mine)
        dist.all_gather_object(objs, rank, group=g)
        assert objs == mine, objs
        if len(mine) > 1:
            me = mine.index(rank)
            nxt, prv = (me + 1) % len(mine), (me - 1) % len(mine)
            got = torch.zeros(2)
            for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, got, group=g, group_peer=prv),
                                             dist.P2POp(dist.isend, torch.full((2,), float(rank)), group=g, group_peer=nxt)]):
                w.wait()
            assert got.tolist() == [float(mine[prv])] * 2, got
        # A split of the split.
        h = dist.split_group(g, split_ranks=[[0]])
        if mine.index(rank) == 0:
            t = torch.ones(1)
            dist.all_reduce(t, group=h)
            assert t.item() == 1.0
        else:
            assert h is None or h == dist.GroupMember.NON_GROUP_MEMBER, h
    # The parent still works after the split, and a destroyed split group leaves it alone.
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [float(n)] * 2
    if mine is not None:
        dist.destroy_process_group(g)
    dist.barrier()


def ddp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    ref.load_state_dict(model.state_dict())
    ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    torch.manual_seed(1)
    data = torch.randn(n * 6, 4)
    target = torch.randn(n * 6, 1)
    mine = slice(rank * 6, (rank + 1) * 6)
    torch.nn.functional.mse_loss(ddp_model(data[mine]), target[mine]).backward()
    # The single-process reference: the mean of the per-rank losses over the whole batch.
    loss = sum(torch.nn.functional.mse_loss(ref(data[r * 6:(r + 1) * 6]), target[r * 6:(r + 1) * 6]) for r in range(n)) / n
    loss.backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), (p.grad, q.grad)


def cuda():
    """CUDA tensors, one GPU per rank: the collectives, messages and a DDP step."""
    dev = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    step = lambda what: print(f"rank {rank}: {what}", flush=True)  # noqa: E731  (where a hang stops)
    total = n * (n + 1) / 2
    step("all_reduce")
    t = torch.full((5,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    assert t.cpu().tolist() == [total] * 5, t
    step("broadcast")
    b = torch.full((3,), float(rank), device=dev)
    dist.broadcast(b, src=n - 1)
    assert b.cpu().tolist() == [float(n - 1)] * 3
    step("all_gather_into_tensor")
    out = torch.zeros(2 * n, device=dev)
    dist.all_gather_into_tensor(out, torch.full((2,), float(rank), device=dev))
    assert out.cpu().tolist() == [float(q) for q in range(n) for _ in range(2)]
    step("reduce_scatter_tensor")
    rs = torch.zeros(2, device=dev)
    dist.reduce_scatter_tensor(rs, torch.arange(2 * n, dtype=torch.float32, device=dev))
    assert rs.cpu().tolist() == [float(n * (2 * rank + i)) for i in range(2)]
    step("all_to_all_single")
    a2a = torch.zeros(n, device=dev)
    dist.all_to_all_single(a2a, torch.arange(n, dtype=torch.float32, device=dev) + 10 * rank)
    assert a2a.cpu().tolist() == [float(10 * q + rank) for q in range(n)]
    if n > 1:
        import accord
        from torch.distributed.distributed_c10d import _coalescing_manager

        step("batch_isend_irecv")
        got = torch.zeros(4, device=dev)
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        # Values that are never zero, so that a receive that never landed cannot pass.
        ops_ = [dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, torch.full((4,), float(rank + 1), device=dev), nxt)]
        with spy_coalescing() as starts:
            works = dist.batch_isend_irecv(ops_)
        for w in works:
            w.wait()
        torch.cuda.synchronize()
        assert got.cpu().tolist() == [float(prv + 1)] * 4, got
        comm = dist.group.WORLD.communicator
        assert comm.gpu_devices == [dev.index], comm.gpu_devices
        try:
            comm.nccl_comm()
            nccl = True
        except RuntimeError:
            nccl = False
        big = 1 << 20  # 4 MiB each: beyond what NCCL buffers, so only one launch group can't deadlock

        def every_pair(batch):
            """Every pair exchanges 4 MiB, receives first on every rank; ``batch`` posts the
            ops and returns the Works."""
            gots = {q: torch.zeros(big, device=dev) for q in range(n) if q != rank}
            ops_ = [dist.P2POp(dist.irecv, gots[q], q) for q in gots]
            ops_ += [dist.P2POp(dist.isend, torch.full((big,), float(10 * rank + q + 1), device=dev), q) for q in gots]
            works = batch(ops_)
            for w in works:
                w.wait()
            for q, g in gots.items():
                assert torch.equal(g, torch.full((big,), float(10 * q + rank + 1), device=dev)), (q, g[:4])
            return works

        def engines():
            records = comm.flight_record()["records"]
            return [r["engine"] for r in records if r["op"] in ("send", "recv")][-2 * (n - 1):]

        step(f"batch_isend_irecv, every pair, receives first (torch coalesces: {bool(starts)})")
        with spy_coalescing() as starts:
            works = every_pair(dist.batch_isend_irecv)
        # One Work for a coalesced batch (as NCCL's), its messages on the device; torch 2.11
        # posts them one by one, and the backend then takes them through host memory.
        assert len(works) == (1 if starts else 2 * (n - 1)), (works, starts)
        if nccl:
            assert all(("GPU" in e) == bool(starts) for e in engines()), engines()

        def coalesced(ops_):
            # What a torch that coalesces this group does in batch_isend_irecv.
            with _coalescing_manager(dist.group.WORLD, dev, async_ops=True) as cm:
                for op in ops_:
                    op.op(op.tensor, op.peer)
            return cm.works

        step("a coalesced batch, every pair, receives first")
        works = every_pair(coalesced)
        assert len(works) == 1, works
        if nccl:
            assert all("GPU" in e for e in engines()), engines()
        step("a coalesced batch whose body raised leaves no launch group open")
        try:
            with _coalescing_manager(dist.group.WORLD, dev, async_ops=True):
                dist.irecv(torch.zeros(4, device=dev), prv)
                raise KeyError("inside the batch")
        except KeyError:
            pass
        assert accord._native.group_depth() == 0
        # The next batch starts clean (it also ends torch's own record of the raised one, under
        # which torch would keep all_reduce calls of this group to itself).
        works = every_pair(coalesced)
        assert len(works) == 1, works
        t = torch.full((3,), float(rank + 1), device=dev)
        dist.all_reduce(t)
        assert t.cpu().tolist() == [total] * 3, t
        step("a CUDA operation inside a launch group is refused")
        with accord.group():
            try:
                dist.all_reduce(t)
            except ValueError as e:
                assert "launch group" in str(e), e
            else:
                raise AssertionError("an all_reduce inside accord.group() was not refused")
        dist.all_reduce(t)
        assert t.cpu().tolist() == [total * n] * 3, t
    step("Work.wait: the current stream waits, the host does not")
    x = torch.ones(1 << 20, device=dev)
    # The first call of a size may set its engine up (Accord's kernels allocate their scratch
    # and synchronise the device once): warm up outside the timed part.
    dist.all_reduce(torch.ones(1 << 20, device=dev))
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # about half a second of GPU time ahead of the all_reduce
    w = dist.all_reduce(x, async_op=True)
    t0 = time.monotonic()
    w.wait()
    waited = time.monotonic() - t0
    assert not w.is_completed(), "wait() blocked the host until the GPU finished"
    assert waited < 0.2, f"wait() took {waited:.3f} s"
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        w.wait()  # the side stream waits for the all_reduce too
        y = x * 2
    side.synchronize()
    assert torch.equal(y, torch.full((1 << 20,), 2.0 * n, device=dev)), y[:4]
    assert w.is_completed() and w.is_success()
    f = dist.all_reduce(torch.ones(3, device=dev), async_op=True).get_future()
    assert f.wait()[0].cpu().tolist() == [float(n)] * 3  # the future completes on the host
    step("ddp")
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2).to(dev)
    ref = torch.nn.Linear(4, 2)
    ref.load_state_dict({k: v.cpu() for k, v in model.state_dict().items()})
    ddp_model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[dev.index])
    torch.manual_seed(1)
    data = torch.randn(n * 3, 4)
    ddp_model(data[rank * 3:(rank + 1) * 3].to(dev)).sum().backward()
    (sum(ref(data[r * 3:(r + 1) * 3]).sum() for r in range(n)) / n).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.allclose(p.grad.cpu(), q.grad, atol=1e-5), (p.grad, q.grad)


def desync():
    t = torch.zeros(3 if rank == 0 else 4)
    try:
        dist.all_reduce(t)
    except dist.DistBackendError as e:
        assert "desync" in str(e) or "gave up" in str(e), e
        print(f"TORCH-DESYNC-RAISED {rank}: {type(e).__name__}", flush=True)
        os._exit(0)
    raise AssertionError("a count mismatch was not an error")


def kill():
    dist.barrier()
    if rank == n - 1:
        os._exit(17)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.zeros(3))
        dist.all_reduce(torch.zeros(3))
    except dist.DistBackendError as e:
        print(f"TORCH-PEER-LOST {rank} after {time.monotonic() - t0:.2f}s: {e}", flush=True)
        os._exit(0)
    raise AssertionError("a killed rank went unnoticed")


{"ops": ops, "ddp": ddp, "split": split, "cuda": cuda, "desync": desync, "kill": kill}[mode]()
dist.destroy_process_group()
if mode == "ops" and sys.argv[2:] == ["store"]:
    # Again on the same store: torch reuses its key prefixes after a destroy.
    dist.init_process_group("accord", store=store, rank=r, world_size=w)
    t = torch.ones(2)
    dist.all_reduce(t)
    assert t.tolist() == [float(n)] * 2
    dist.destroy_process_group()
print(f"TORCH-BACKEND-OK {mode} {rank}", flush=True)
