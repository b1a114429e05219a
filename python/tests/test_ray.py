"""Real Ray actors on CPU: ray.util.collective with backend "accord", and accord.collective.

The fault tests keep every wait short (ACCORD_TIMEOUT of a few seconds in the actors, bounded
ray.get) and kill their actors at the end.
"""

import os
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray not installed (pip install ray)")


@pytest.fixture(scope="module")
def ray_session():
    # The setup hook registers backend "accord" in every worker, whether or not the actor's
    # code imports accord (see BareWorker).
    hook = {"worker_process_setup_hook": "accord.collective.register_ray_backend"}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True, ignore_reinit_error=True, runtime_env=hook)
    yield
    ray.shutdown()


@ray.remote(num_cpus=0.5)
class Worker:
    def __init__(self, rank, n):
        import accord.collective  # registers the "accord" backend of ray.util.collective

        self.rank, self.n = rank, n

    def ray_api(self, group):
        import ray.util.collective as col

        col.init_collective_group(self.n, self.rank, backend="accord", group_name=group)
        x = np.full(4, self.rank + 1, np.float32)
        col.allreduce(x, group_name=group)
        b = np.full(2, self.rank, np.int64)
        col.broadcast(b, src_rank=1, group_name=group)
        lst = [np.zeros(3, np.int32) for _ in range(self.n)]
        col.allgather(lst, np.full(3, self.rank, np.int32), group_name=group)
        col.barrier(group_name=group)
        out = np.zeros(2, np.float64)
        col.reducescatter(out, [np.full(2, r, np.float64) for r in range(self.n)], group_name=group)
        got = None
        if self.rank == 0:
            col.send(np.arange(3, dtype=np.float32), 1, group_name=group)
        elif self.rank == 1:
            got = np.zeros(3, np.float32)
            col.recv(got, 0, group_name=group)
            got = got.tolist()
        rank = col.get_rank(group)
        col.destroy_collective_group(group)
        return x.tolist(), b.tolist(), [l.tolist() for l in lst], out.tolist(), got, rank

    def multi_tensor(self, group, k):
        """Ray's multi-GPU calls with `k` host tensors per process (Ray's functions need CuPy,
        so the calls go to the group handle as they do, and to accord.collective's own
        *_multigpu functions): every tensor of every process takes part."""
        import ray.util.collective as rcol
        from ray.util.collective import types

        from accord import collective as col

        rcol.init_collective_group(self.n, self.rank, backend="accord", group_name=group)
        g = rcol.get_group_handle(group)
        val = lambda r, i: float(10 * r + i + 1)  # noqa: E731  tensor i of rank r
        out = {}
        ts = [np.full(3, val(self.rank, i), np.float64) for i in range(k)]
        opts = types.AllReduceOptions()
        opts.reduceOp = types.ReduceOp.SUM
        g.allreduce(ts, opts)
        out["allreduce"] = [t.tolist() for t in ts]
        ts = [np.full(3, val(self.rank, i), np.float64) for i in range(k)]
        opts = types.ReduceOptions()
        opts.reduceOp, opts.root_rank, opts.root_tensor = types.ReduceOp.MAX, self.n - 1, k - 1
        g.reduce(ts, opts)
        out["reduce"] = [t.tolist() for t in ts]
        ts = [np.full(2, val(self.rank, i), np.int64) for i in range(k)]
        opts = types.BroadcastOptions()
        opts.root_rank, opts.root_tensor = self.n - 1, k - 1
        g.broadcast(ts, opts)
        out["broadcast"] = [t.tolist() for t in ts]
        lists = [[np.zeros(2, np.float32) for _ in range(self.n * k)] for _ in range(k)]
        g.allgather(lists, [np.full(2, val(self.rank, i), np.float32) for i in range(k)], types.AllGatherOptions())
        out["allgather"] = [[e.tolist() for e in lst] for lst in lists]
        ins = [[np.full(2, 100 * self.rank + 10 * i + e, np.float64) for e in range(self.n * k)] for i in range(k)]
        outs = [np.zeros(2, np.float64) for _ in range(k)]
        opts = types.ReduceScatterOptions()
        opts.reduceOp = types.ReduceOp.SUM
        g.reducescatter(outs, ins, opts)
        out["reducescatter"] = [t.tolist() for t in outs]
        # accord.collective's own multi-GPU functions (its groups are its own), and n_elements
        # on messages.
        col.init_collective_group(self.n, self.rank, group_name=group + "-accord", timeout_ms=30000)
        out["timeout"] = col.get_group_handle(group + "-accord").timeout
        ts = [np.full(2, val(self.rank, i), np.int32) for i in range(k)]
        col.allreduce_multigpu(ts, group_name=group + "-accord", op="min")
        out["allreduce_multigpu_min"] = [t.tolist() for t in ts]
        if self.rank == 0:
            col.send_multigpu(np.arange(5, dtype=np.float32), 1, 0, group_name=group + "-accord", n_elements=3)
        elif self.rank == 1:
            got = np.full(5, -1, np.float32)
            col.recv_multigpu(got, 0, 0, group_name=group + "-accord", n_elements=3)
            out["n_elements"] = got.tolist()
        try:
            g.allreduce([np.zeros(3), np.zeros(4)], types.AllReduceOptions())
        except col.ListMismatchError as e:
            out["mismatch"] = str(e)
        try:  # a view that is not contiguous cannot be received into (it would be a copy)
            col.recv_multigpu(np.zeros((3, 2)).T, 1 - self.rank, 0, group_name=group + "-accord")
        except ValueError as e:
            out["noncontiguous"] = str(e)
        rcol.destroy_collective_group(group)
        col.destroy_collective_group(group + "-accord")
        return out

    def join(self, group, api, accord_timeout=None, then_sum=False):
        """Join `group` through `api` ("ray" or "accord"); returns (seconds taken, error type or
        None, message, waiting_for, allreduce of rank + 1 over the group when `then_sum`)."""
        import ray.util.collective as rcol

        from accord import collective as col

        if accord_timeout is not None:
            os.environ["ACCORD_TIMEOUT"] = str(accord_timeout)
        t0 = time.monotonic()
        try:
            if api == "ray":
                rcol.init_collective_group(self.n, self.rank, backend="accord", group_name=group)
            else:
                col.init_collective_group(self.n, self.rank, group_name=group)
        except Exception as e:
            return time.monotonic() - t0, type(e).__name__, str(e), getattr(e, "waiting_for", None), None
        total = None
        if then_sum:
            x = np.array([self.rank + 1], np.int64)
            (rcol if api == "ray" else col).allreduce(x, group_name=group)
            total = int(x[0])
        return time.monotonic() - t0, None, None, None, total

    def lone_barrier(self, group, timeout_ms):
        """A barrier that only this rank enters, bounded by Ray's per-call timeout_ms."""
        import datetime

        import ray.util.collective as rcol
        from ray.util.collective.types import BarrierOptions

        opts = BarrierOptions()
        opts.timeout_ms = datetime.timedelta(milliseconds=timeout_ms)
        t0 = time.monotonic()
        try:
            rcol.get_group_handle(group).barrier(opts)
        except Exception as e:
            return time.monotonic() - t0, type(e).__name__, str(e)
        return time.monotonic() - t0, None, None

    def write_scalar(self, group):
        """The Ray API returns nothing, so a scalar it would have to write is refused."""
        from accord import collective as col

        try:
            col.allreduce(np.float32(1.5), group_name=group)
        except TypeError as e:
            return str(e)
        return None

    def accord_api(self, group, declared):
        from accord import collective as col

        if not declared:
            col.init_collective_group(self.n, self.rank, group_name=group)
        x = np.full(3, self.rank, np.int64)
        col.allreduce(x, group_name=group, op="max")
        gl = [np.zeros(2, np.float32) for _ in range(self.n)] if self.rank == 0 else None
        col.gather(np.full(2, self.rank, np.float32), gl, dst_rank=0, group_name=group)
        sc = np.zeros(2, np.int32)
        col.scatter(sc, [np.full(2, 10 * r, np.int32) for r in range(self.n)] if self.rank == 0 else None, src_rank=0, group_name=group)
        a2a_in = np.array([100 * self.rank + j for j in range(self.n)], np.int64)
        a2a = np.zeros(self.n, np.int64)
        col.alltoall(a2a_in, a2a, group_name=group)
        size = col.get_collective_group_size(group)
        col.destroy_collective_group(group)
        return x.tolist(), gl and [g.tolist() for g in gl], sc.tolist(), a2a.tolist(), size


@ray.remote(num_cpus=0.5)
class BareWorker:
    """An actor written for Ray's own API: it never imports accord, keeps the arrays it is
    handed (read-only views of Ray's object store) and reduces into them in place, as Ray's
    own collective tests do."""

    def __init__(self, rank, n, group):
        import ray.util.collective as col

        col.init_collective_group(n, rank, backend="accord", group_name=group)
        self.group, self.rank, self.buffer = group, rank, None

    def set_buffer(self, data):
        self.buffer = data
        return self.buffer.flags.writeable

    def do(self, what, op=None):
        import ray.util.collective as col
        from ray.util.collective.types import ReduceOp

        if what == "allreduce":
            col.allreduce(self.buffer, self.group, getattr(ReduceOp, op or "SUM"))
        elif what == "broadcast":
            col.broadcast(self.buffer, 1, self.group)
        elif what == "recv":
            col.recv(self.buffer, 0, self.group) if col.get_rank(self.group) == 1 else col.send(np.full_like(self.buffer, 7), 1, self.group)
        return self.buffer

    def lists(self):
        """List-based calls with an entry of the wrong size, and with lists mixing numpy arrays
        and torch tensors (Ray's gloo backend takes both)."""
        import ray.util.collective as col

        out = {}
        try:
            col.allgather([np.zeros(20, np.float32) for _ in range(2)], np.ones(10, np.float32), self.group)
        except Exception as e:
            out["mismatch"] = (isinstance(e, RuntimeError), isinstance(e, ValueError), str(e))
        try:
            import torch
        except ImportError:
            return out
        lst = [torch.zeros(4), np.zeros(4, np.float32)]
        col.allgather(lst, np.full(4, self.rank + 1, np.float32), self.group)
        out["allgather"] = [np.asarray(x).tolist() for x in lst]
        r = torch.zeros(4)
        col.reducescatter(r, [torch.ones(4), np.full(4, 2, np.float32)], self.group)
        out["reducescatter"] = r.tolist()
        return out

    def accord_loaded_by(self):
        import sys

        return "accord" in sys.modules


def test_ray_api_without_importing_accord_writes_store_arrays_copy_on_write(ray_session):
    """Both actors are handed one object of the store (shared memory on this node) and reduce
    into it in place: each gets the result in its own array, and the object stays as it was
    (written in place there, as Ray's gloo does, the two would reduce into one memory)."""
    import accord.collective

    if not accord.collective.RAY_BACKEND_REGISTERED:
        pytest.skip("installed Ray has no ray.util.collective.register_collective_backend")
    n = 2
    actors = [BareWorker.remote(r, n, "bare") for r in range(n)]
    try:
        for size in (10, 300_000):  # inlined in the call, and in the shared store
            base = np.arange(size, dtype=np.float32)
            ref = ray.put(base)
            assert ray.get([a.set_buffer.remote(ref) for a in actors], timeout=60) == [False] * n
            got = ray.get([a.do.remote("allreduce") for a in actors], timeout=60)
            for g in got:
                np.testing.assert_array_equal(g, base * n)
            np.testing.assert_array_equal(ray.get(ref), base)
            # Ray's ReduceOp names; arrays passed by value, not by reference.
            ray.get([a.set_buffer.remote(base + r) for r, a in enumerate(actors)], timeout=60)
            got = ray.get([a.do.remote("allreduce", "MAX") for a in actors], timeout=60)
            np.testing.assert_array_equal(got[0], base + n - 1)
            ray.get([a.set_buffer.remote(base + r) for r, a in enumerate(actors)], timeout=60)
            got = ray.get([a.do.remote("broadcast") for a in actors], timeout=60)
            np.testing.assert_array_equal(got[0], base + 1)
            ray.get([a.set_buffer.remote(ref) for a in actors], timeout=60)
            got = ray.get([a.do.remote("recv") for a in actors], timeout=60)
            np.testing.assert_array_equal(got[1], np.full(size, 7, np.float32))
            np.testing.assert_array_equal(ray.get(ref), base)
        assert ray.get(actors[0].accord_loaded_by.remote(), timeout=60)  # by the hook only
    finally:
        _kill(actors)


def test_ray_list_calls_check_sizes_and_mix_numpy_and_torch(ray_session):
    import importlib.util

    import accord.collective

    if not accord.collective.RAY_BACKEND_REGISTERED:
        pytest.skip("installed Ray has no ray.util.collective.register_collective_backend")
    actors = [BareWorker.remote(r, 2, "lists") for r in range(2)]
    try:
        res = ray.get([a.lists.remote() for a in actors], timeout=60)
    finally:
        _kill(actors)
    for r, out in enumerate(res):
        is_runtime, is_value, msg = out["mismatch"]
        assert is_runtime and is_value and "tensor_list[0] holds 20 elements" in msg, out
        if importlib.util.find_spec("torch") is None:
            continue  # said by the missing keys: torch is not installed
        assert out["allgather"] == [[1.0] * 4, [2.0] * 4], out
        assert out["reducescatter"] == [[2.0] * 4, [4.0] * 4][r], out


@pytest.mark.parametrize("k", [1, 2, 3])
def test_ray_multi_gpu_semantics_with_several_tensors_per_process(ray_session, k):
    """With k tensors per process every tensor takes part, in (rank, tensor) order, as Ray's
    NCCL backend does with one GPU per tensor (not tensor i with tensor i of the others)."""
    n = 2
    actors = [Worker.remote(r, n) for r in range(n)]
    res = ray.get([a.multi_tensor.remote(f"multi{k}", k) for a in actors], timeout=120)
    val = lambda r, i: float(10 * r + i + 1)  # noqa: E731
    every = [val(r, i) for r in range(n) for i in range(k)]
    for rank, out in enumerate(res):
        assert out["allreduce"] == [[sum(every)] * 3] * k
        want_reduce = [[val(rank, i)] * 3 for i in range(k)]
        if rank == n - 1:
            want_reduce[k - 1] = [max(every)] * 3
        assert out["reduce"] == want_reduce
        assert out["broadcast"] == [[int(val(n - 1, k - 1))] * 2] * k
        assert out["allgather"] == [[[v] * 2 for v in every]] * k
        want_rs = [
            [float(sum(100 * r + 10 * j + (rank * k + i) for r in range(n) for j in range(k)))] * 2 for i in range(k)
        ]
        assert out["reducescatter"] == want_rs
        assert out["allreduce_multigpu_min"] == [[int(min(every))] * 2] * k
        assert "holds 4 elements but the tensor holds 3" in out["mismatch"]
        assert "not contiguous" in out["noncontiguous"]
    assert res[1]["n_elements"] == [0.0, 1.0, 2.0, -1.0, -1.0]
    assert [out["timeout"] for out in res] == [30.0] * n


def test_detaching_leaves_other_arrays_alone():
    from accord import _arrays

    y = np.frombuffer(bytes(8), np.float32)  # read-only, but not Ray's: refused by the call
    assert not _arrays.detach_from_ray_store(y) and not y.flags.writeable


def test_ray_backend_registered(ray_session):
    import accord.collective

    if not accord.collective.RAY_BACKEND_REGISTERED:
        pytest.skip("installed Ray has no ray.util.collective.register_collective_backend")
    n = 3
    actors = [Worker.remote(r, n) for r in range(n)]
    res = ray.get([a.ray_api.remote("g1") for a in actors], timeout=120)
    for r, (x, b, lst, out, got, rank) in enumerate(res):
        assert x == [6.0] * 4 and b == [1, 1] and lst == [[i] * 3 for i in range(n)]
        assert out == [float(r * n)] * 2 and rank == r
    assert res[1][4] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("declared", [False, True])
def test_accord_collective(ray_session, declared):
    from accord import collective as col

    n = 3
    actors = [Worker.remote(r, n) for r in range(n)]
    group = f"g2-{declared}"
    if declared:
        col.create_collective_group(actors, n, list(range(n)), group_name=group)
    res = ray.get([a.accord_api.remote(group, declared) for a in actors], timeout=120)
    for r, (x, gl, sc, a2a, size) in enumerate(res):
        assert x == [n - 1] * 3 and sc == [10 * r] * 2 and size == n
        assert a2a == [100 * i + r for i in range(n)]
    assert res[0][1] == [[float(i)] * 2 for i in range(n)]


def _kill(actors):
    for a in actors:
        ray.kill(a)


@pytest.mark.parametrize("api", ["ray", "accord"])
def test_missing_member_times_out_after_accord_timeout(ray_session, api):
    """Ranks 0 and 1 of 3 join; rank 2 never does: both fail after ACCORD_TIMEOUT (3 s), not
    300 s, with accord.TimeoutError naming rank 2."""
    import accord.collective

    if api == "ray" and not accord.collective.RAY_BACKEND_REGISTERED:
        pytest.skip("installed Ray has no ray.util.collective.register_collective_backend")
    actors = [Worker.remote(r, 3) for r in range(2)]
    try:
        res = ray.get([a.join.remote(f"missing-{api}", api, 3) for a in actors], timeout=60)
    finally:
        _kill(actors)
    _, err, msg, waiting_for, _ = res[0]
    assert err == "TimeoutError" and waiting_for == [2] and "2" in msg, (err, waiting_for, msg)
    # The rank whose deadline runs out first gives up for both; the other may have started
    # its wait later (actors start at different times), so only the longer wait is ~3 s.
    waits = [r[0] for r in res]
    assert 2.5 <= max(waits) and max(waits) <= 13, (waits, msg)
    # Rank 1 times out too, or first sees rank 0 give up and close the store.
    took, err, msg, waiting_for, _ = res[1]
    assert (err, waiting_for) == ("TimeoutError", [2]) or (err == "StoreError" and "rank 0 gave up" in msg), (err, msg)
    assert took <= 13, (took, msg)


def test_missing_rank0_times_out_after_accord_timeout(ray_session):
    """Rank 1 waits for a rank 0 that never comes: it fails after ACCORD_TIMEOUT naming rank 0."""
    a = Worker.remote(1, 2)
    try:
        took, err, msg, waiting, _ = ray.get(a.join.remote("no-rank0", "accord", 3), timeout=60)
    finally:
        _kill([a])
    assert err == "TimeoutError" and "rank 0" in msg and waiting == [0], (err, msg, waiting)
    assert 2.5 <= took <= 13, (took, msg)


def test_ray_call_timeout_ms(ray_session):
    """Ray's per-call timeout_ms bounds a call more tightly than the group's timeout."""
    import accord.collective

    if not accord.collective.RAY_BACKEND_REGISTERED:
        pytest.skip("installed Ray has no ray.util.collective.register_collective_backend")
    actors = [Worker.remote(r, 2) for r in range(2)]
    try:
        res = ray.get([a.join.remote("call-timeout", "ray", 60) for a in actors], timeout=60)
        assert all(err is None for _, err, _, _, _ in res), res
        took, err, msg = ray.get(actors[0].lone_barrier.remote("call-timeout", 1500), timeout=60)
    finally:
        _kill(actors)
    assert err == "TimeoutError", (err, msg)
    assert 1.0 <= took <= 10, (took, msg)


def test_scalar_refused_where_written(ray_session):
    a = Worker.remote(0, 1)
    try:
        ray.get(a.join.remote("scalar", "accord", 30), timeout=60)
        msg = ray.get(a.write_scalar.remote("scalar"), timeout=60)
    finally:
        _kill([a])
    assert msg is not None and "float32" in msg and "in place" in msg, msg


@pytest.mark.parametrize("when", ["formed", "forming"])
def test_recreate_after_rank0_killed(ray_session, when):
    """A group whose rank 0 actor is killed (after the group formed, or while it waited for the
    others) is re-created under the same name by new actors: the new rank 1 starts first, so it
    would find any entry the dead group left, yet it joins the new group within seconds."""
    from ray.experimental import internal_kv

    group = f"recreate-{when}"
    old = [Worker.remote(r, 2) for r in range(2 if when == "formed" else 1)]
    try:
        if when == "formed":
            res = ray.get([a.join.remote(group, "accord", 60, True) for a in old], timeout=60)
            assert [r[4] for r in res] == [3, 3], res
        else:
            pending = old[0].join.remote(group, "accord", 60)
            deadline = time.monotonic() + 30
            while not internal_kv._internal_kv_get(f"accord/collective/{group}"):
                assert time.monotonic() < deadline, "rank 0 never published its store"
                time.sleep(0.05)
        ray.kill(old[0])
        if when == "forming":
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(pending, timeout=30)
    finally:
        _kill(old)
    new = [Worker.remote(r, 2) for r in range(2)]
    try:
        ray.get([a.__ray_ready__.remote() for a in new], timeout=60)
        late = new[1].join.remote(group, "accord", 60, True)
        time.sleep(1.5)  # rank 1 polls the name before the new rank 0 publishes
        early = new[0].join.remote(group, "accord", 60, True)
        res = ray.get([early, late], timeout=40)
    finally:
        _kill(new)
    for r, (took, err, msg, _, total) in enumerate(res):
        assert err is None, (r, err, msg)
        assert total == 3, (r, total)
    assert res[1][0] < 15, res


def test_timeout_resolution(monkeypatch):
    from accord import collective as col

    monkeypatch.delenv("ACCORD_TIMEOUT", raising=False)
    assert col._resolve_timeout(None) == col.DEFAULT_TIMEOUT
    monkeypatch.setenv("ACCORD_TIMEOUT", "2.5")
    assert col._resolve_timeout(None) == 2.5 and col._resolve_timeout(7) == 7
    for bad in ["soon", "0", "-1", "inf", "nan"]:
        monkeypatch.setenv("ACCORD_TIMEOUT", bad)
        with pytest.raises(ValueError, match="ACCORD_TIMEOUT"):
            col._resolve_timeout(None)


def test_stale_entry_of_another_store_is_skipped(ray_session):
    """The name's entry points at a store that answers but is another one (its token differs,
    as when a dead group's port was reused): rank 1 refuses it and joins the new rank 0."""
    import json

    from ray.experimental import internal_kv

    import accord

    group = "stale-other-store"
    other = accord.StoreServer("127.0.0.1", 0)
    stale = {"addr": f"127.0.0.1:{other.port}", "token": "a-dead-group's", "incarnation": "old"}
    internal_kv._internal_kv_put(f"accord/collective/{group}", json.dumps(stale), overwrite=True)
    new = [Worker.remote(r, 2) for r in range(2)]
    try:
        ray.get([a.__ray_ready__.remote() for a in new], timeout=60)
        late = new[1].join.remote(group, "accord", 60, True)
        time.sleep(1.5)
        early = new[0].join.remote(group, "accord", 60, True)
        res = ray.get([early, late], timeout=40)
    finally:
        _kill(new)
        other.close()
    assert [(err, total) for _, err, _, _, total in res] == [(None, 3), (None, 3)], res
    assert res[1][0] < 15, res


def test_ray_direct_transport_moves_tensors_through_accord(ray_session):
    pytest.importorskip("torch", reason="torch not installed")
    import accord.rdt

    if not accord.rdt.register():
        pytest.skip("installed Ray has no custom tensor transports (ray.experimental.rdt)")
    from ray.experimental.collective import create_collective_group, destroy_collective_group

    # The transport must be registered before a method names it (checked as the class is made).
    @ray.remote(num_cpus=0.5)
    class TensorActor:
        @ray.method(tensor_transport="accord")
        def make(self, n, scale):
            import torch

            return torch.arange(n, dtype=torch.float64) * scale

        def total(self, t, group_name):
            import ray.util.collective as rcol

            # The tensor came as an Accord message of this group (not through the object store).
            received = rcol.get_group_handle(group_name)._comm.metrics()["p2p_ops"]
            return float(t.sum()), str(t.device), list(t.shape), received

    producer, consumer = TensorActor.remote(), TensorActor.remote()
    group = create_collective_group([producer, consumer], backend="accord")
    try:
        for i, (n, scale) in enumerate(((10, 1.0), (100_000, 0.5))):
            ref = producer.make.remote(n, scale)
            total, device, shape, received = ray.get(consumer.total.remote(ref, group.name), timeout=60)
            assert (total, device, shape) == (scale * n * (n - 1) / 2, "cpu", [n])
            assert received == i + 1, received
    finally:
        destroy_collective_group(group)
        _kill([producer, consumer])
