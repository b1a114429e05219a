"""Real Ray actors on CPU: ray.util.collective with backend "accord", and accord.collective."""

import numpy as np
import pytest

ray = pytest.importorskip("ray", reason="ray not installed (pip install ray)")


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=True, ignore_reinit_error=True)
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
