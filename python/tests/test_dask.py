"""accord.dask over a real Dask LocalCluster (3 worker processes, one thread each, CPU only):
raft-dask's Comms arguments and calls, every collective, rank order, destroy (explicit and by
the garbage collector) and a worker dying mid-collective. One cluster serves the whole module;
a test that kills a worker leaves the nanny to restart it."""

import gc
import os
import socket
import time

import numpy as np
import pytest

distributed = pytest.importorskip("distributed", reason="dask.distributed not installed (pip install 'dask[distributed]')")

N = 3


@pytest.fixture(scope="module")
def client():
    with distributed.LocalCluster(n_workers=N, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster, timeout=60) as c:
            c.wait_for_workers(N, timeout=60)
            yield c


def _workers(client):
    """The N live workers (a killed one is replaced by its nanny within seconds)."""
    client.wait_for_workers(N, timeout=60)
    deadline = time.monotonic() + 60
    while True:
        workers = list(client.scheduler_info(n_workers=-1)["workers"])
        if len(workers) == N:
            try:
                client.run(os.getpid, workers=workers)
                return workers
            except Exception:
                pass
        assert time.monotonic() < deadline, workers
        time.sleep(0.2)


def _gather(client, futures, timeout):
    """client.gather, bounded."""
    distributed.wait(futures, timeout=timeout)
    return client.gather(futures)


def _sessions_on(client, workers):
    from accord.dask import _sessions_here

    return client.run(_sessions_here, workers=workers)


def _wait_sessions_gone(client, workers, session_id, limit=10.0):
    deadline = time.monotonic() + limit
    while True:
        left = {w: s for w, s in _sessions_on(client, workers).items() if session_id in s}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _refused(address):
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
    except OSError:
        return True
    return False


# ------------------------------------------------------------------------------------------------


def _barrier_rank(comm):
    comm.barrier()
    return comm.rank, comm.size


def test_init_destroy_three_times_in_one_client(client):
    from accord.dask import Comms

    workers = _workers(client)
    seen = set()
    for _ in range(3):
        comms = Comms(client=client, timeout=30)
        comms.init()
        try:
            assert comms.initialized and comms.nccl_initialized
            assert sorted(comms.worker_addresses) == sorted(workers)
            res = _gather(client, comms.submit(_barrier_rank), 30)
            assert res == [(r, N) for r in range(N)]
            assert all(comms.session_id in s for s in _sessions_on(client, workers).values())
        finally:
            comms.destroy()
        assert not comms.initialized
        assert _wait_sessions_gone(client, workers, comms.session_id, limit=0) == {}
        assert _refused(comms.store_address)
        seen.add(comms.sessionId)
    assert len(seen) == 3


def _every_collective(comm):
    """Every collective on numpy data; returns what each produced, checked by the client."""
    r, n = comm.rank, comm.size
    out = {}
    x = np.arange(4, dtype=np.float64) + r
    comm.allreduce(x)
    out["allreduce"] = x.tolist()
    m = np.array([r + 1], np.int64)
    comm.allreduce(m, op="max")
    out["allreduce_max"] = m.tolist()
    b = np.full(3, r, np.int32) if r == 1 else np.zeros(3, np.int32)
    comm.broadcast(b, root=1)
    out["broadcast"] = b.tolist()
    red = np.full(2, r + 1, np.float32)
    comm.reduce(red, op="sum", root=2)
    out["reduce"] = red.tolist()
    ag = np.zeros(2 * n, np.int64)
    comm.allgather(np.array([r, 10 * r], np.int64), ag)
    out["allgather"] = ag.tolist()
    g = np.zeros(n, np.int32) if r == 0 else None
    got = comm.gather(np.array([r * r], np.int32), g, root=0)
    out["gather"] = None if got is None else got.tolist()
    sc = np.zeros(2, np.float64)
    src = np.arange(2 * n, dtype=np.float64) * 1.5 if r == 2 else None
    comm.scatter(src, sc, root=2)
    out["scatter"] = sc.tolist()
    rs = np.zeros(2, np.int64)
    comm.reduce_scatter(np.arange(2 * n, dtype=np.int64) * (r + 1), rs)
    out["reduce_scatter"] = rs.tolist()
    a2a = np.zeros(n, np.int32)
    comm.alltoall(np.array([100 * r + j for j in range(n)], np.int32), a2a)
    out["alltoall"] = a2a.tolist()
    comm.barrier()
    # Point to point: 0 -> 1 with send/recv, and a ring with sendrecv.
    if r == 0:
        comm.send(np.array([7, 8, 9], np.int16), dst=1, tag=5)
    elif r == 1:
        p = np.zeros(3, np.int16)
        comm.recv(p, src=0, tag=5)
        out["recv"] = p.tolist()
    ring = np.zeros(1, np.int64)
    comm.sendrecv(np.array([r], np.int64), (r + 1) % n, ring, (r - 1) % n)
    out["sendrecv"] = ring.tolist()
    return out


def test_every_collective(client):
    from accord.dask import Comms

    _workers(client)
    comms = Comms(client=client, timeout=30)
    comms.init()
    try:
        res = _gather(client, comms.submit(_every_collective), 60)
    finally:
        comms.destroy()
    n = N
    data = [np.arange(4, dtype=np.float64) + r for r in range(n)]
    for r, o in enumerate(res):
        assert o["allreduce"] == sum(data).tolist()
        assert o["allreduce_max"] == [n]
        assert o["broadcast"] == [1, 1, 1]
        assert o["reduce"] == ([float(sum(range(1, n + 1)))] * 2 if r == 2 else [float(r + 1)] * 2)
        assert o["allgather"] == [v for q in range(n) for v in (q, 10 * q)]
        assert o["gather"] == ([q * q for q in range(n)] if r == 0 else None)
        assert o["scatter"] == (np.arange(2 * n) * 1.5)[2 * r : 2 * r + 2].tolist()
        full = sum(np.arange(2 * n, dtype=np.int64) * (q + 1) for q in range(n))
        assert o["reduce_scatter"] == full[2 * r : 2 * r + 2].tolist()
        assert o["alltoall"] == [100 * q + r for q in range(n)]
        assert o["sendrecv"] == [(r - 1) % n]
    assert res[1]["recv"] == [7, 8, 9]


def _local_comm_task(session_id, rank):
    from accord.dask import local_comm, local_handle

    comm = local_comm(session_id)
    assert comm is local_handle(session_id)
    assert comm.rank == rank
    x = np.full(5, comm.rank + 1, np.float64)
    comm.allreduce(x)
    return x.tolist()


def test_raft_style_tasks(client):
    """raft-dask's pattern: Comms(client) positional, one client.submit per worker address with
    the session id, local_comm/local_handle inside."""
    from accord.dask import Comms

    _workers(client)
    comms = Comms(client, timeout=30)
    comms.init()
    try:
        futs = [
            client.submit(_local_comm_task, comms.sessionId, comms.worker_rank(w), workers=[w], pure=False)
            for w in comms.worker_addresses
        ]
        assert _gather(client, futs, 30) == [[6.0] * 5] * N
    finally:
        comms.destroy()


def _set_cvd(value):
    if value is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = value


def test_worker_info_shape_and_rank_order(client):
    from accord.dask import Comms

    workers = _workers(client)
    comms = Comms(client=client)
    info = comms.worker_info(workers)
    assert set(info) == set(workers)
    assert [i["rank"] for i in info.values()] == list(range(N))
    pids = client.run(os.getpid, workers=workers)
    for w, i in info.items():
        assert {"rank", "port", "host", "hostname", "pid", "gpu", "streams_per_handle"} <= set(i)
        assert w.endswith(f":{i['port']}") and i["host"] in w
        assert i["pid"] == pids[w] and i["gpu"] is None and i["streams_per_handle"] == 0
    # One host, no GPU: the order the workers were given in.
    assert list(comms.worker_info(workers[::-1])) == workers[::-1]

    # GPUs (CUDA_VISIBLE_DEVICES, as dask-cuda sets it) order the ranks of a host.
    cvd = {workers[0]: "2,0,1", workers[1]: "0,1,2", workers[2]: "1,2,0"}
    for w, v in cvd.items():
        client.run(_set_cvd, v, workers=[w])
    try:
        info = comms.worker_info(workers)
        assert list(info) == [workers[1], workers[2], workers[0]]
        assert [info[w]["gpu"] for w in info] == [0, 1, 2]
        # A session over them has those ranks (its GPUs not attached: there are none here).
        gpu_less = Comms(client=client, timeout=30, attach_gpus=False)
        gpu_less.init()
        try:
            assert gpu_less.worker_addresses == list(info)
            ranks = _gather(client, gpu_less.submit(_barrier_rank), 30)
            assert [r for r, _ in ranks] == list(range(N))
            got = client.run(_rank_of, gpu_less.session_id, workers=workers)
            assert got == {w: info[w]["rank"] for w in workers}
        finally:
            gpu_less.destroy()
    finally:
        client.run(_set_cvd, None, workers=workers)


def _rank_of(session_id):
    from accord.dask import local_comm

    return local_comm(session_id).rank


def test_rank_order_across_hosts():
    """raft-dask's order: hosts as they first appear, then the GPU index on each host; no GPU
    last, ties in the given order."""
    from accord.dask import _rank_order

    ws = ["tcp://10.0.0.2:1", "tcp://10.0.0.1:2", "tcp://10.0.0.2:3", "tcp://10.0.0.1:4", "tcp://10.0.0.1:5"]
    facts = {ws[0]: {"gpu": 1}, ws[1]: {"gpu": None}, ws[2]: {"gpu": 0}, ws[3]: {"gpu": 3}, ws[4]: {"gpu": 2}}
    assert _rank_order(ws, facts) == [ws[2], ws[0], ws[4], ws[3], ws[1]]


def test_gpu_attach_needs_gpus(client):
    """attach_gpus=True on workers without a GPU is refused before anything starts; with a GPU
    claimed (CUDA_VISIBLE_DEVICES) but no CUDA here, every rank's attach fails and init raises
    promptly, leaving no session behind. (The attach itself needs a GPU: not tested here.)"""
    import accord
    from accord.dask import Comms

    workers = _workers(client)
    with pytest.raises(ValueError, match="no GPU"):
        Comms(client=client, attach_gpus=True).init()
    client.run(_set_cvd, "0", workers=workers)
    try:
        comms = Comms(client=client, timeout=20)
        t0 = time.monotonic()
        with pytest.raises((accord.AccordError, RuntimeError, OSError)):
            comms.init()
        assert time.monotonic() - t0 < 20
        assert not comms.initialized
        assert _wait_sessions_gone(client, workers, comms.session_id, limit=5) == {}
    finally:
        client.run(_set_cvd, None, workers=workers)


def test_raft_constructor_arguments(client, caplog):
    import logging

    from accord.dask import EVENT_TOPIC, Comms

    workers = _workers(client)
    with pytest.raises(ValueError, match="nccl_root_location"):
        Comms(client=client, nccl_root_location="gpu")
    for location in ("client", "worker", "SCHEDULER"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="accord.dask"):
            comms = Comms(comms_p2p=True, client=client, verbose=True, streams_per_handle=2, nccl_root_location=location)
            assert comms.nccl_root_location == location.lower() and comms.streams_per_handle == 2
            assert not comms.ucx_initialized
            comms.init()
            try:
                assert comms.ucx_initialized and comms.nccl_initialized
                assert all(i["streams_per_handle"] == 2 for i in comms.worker_info(workers).values())
                assert _gather(client, comms.submit(_barrier_rank), 30) == [(r, N) for r in range(N)]
                with pytest.warns(UserWarning, match="already been initialized"):
                    comms.init()
            finally:
                comms.destroy()
            assert _refused(comms.store_address), location
        assert "Initialization complete" in caplog.text and comms.session_id in caplog.text
    events = [msg for _, msg in client.get_events(EVENT_TOPIC)]
    assert any(comms.session_id in m and "joined as rank" in m for m in events), events
    # Quiet by default; Comms() finds the default client.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="accord.dask"):
        quiet = Comms()
        assert quiet.client is client and not quiet.comms_p2p and quiet.nccl_root_location == "scheduler"
        quiet.init()
        quiet.destroy()
    assert quiet.session_id not in caplog.text


def test_garbage_collection_destroys(client):
    from accord.dask import Comms

    workers = _workers(client)
    comms = Comms(client=client, timeout=30)
    comms.init()
    session_id, store = comms.session_id, comms.store_address
    assert all(session_id in s for s in _sessions_on(client, workers).values())
    del comms
    gc.collect()
    assert _wait_sessions_gone(client, workers, session_id) == {}
    assert _refused(store)


def _allreduce_or_die(comm, victim, stamp):
    if comm.rank == victim:
        time.sleep(1.0)  # the others are in the allreduce by now
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os._exit(1)
    x = np.ones(1 << 16, np.float32)
    comm.allreduce(x)
    return x[:4].tolist()


def _allreduce_sum(comm):
    x = np.full(4, comm.rank + 1, np.float32)
    comm.allreduce(x)
    return x.tolist()


def test_worker_dies_mid_collective(client, tmp_path):
    """One task exits its worker's process while the others are in an allreduce (with a 120 s
    deadline): theirs fail within seconds with an error naming the dead rank and its worker, and
    a new session over the survivors works."""
    import accord
    from accord.dask import Comms

    _workers(client)
    comms = Comms(client=client, timeout=120)
    comms.init()
    victim_rank = 1
    victim = comms.worker_addresses[victim_rank]
    survivors = [w for w in comms.worker_addresses if w != victim]
    try:
        t0 = time.monotonic()
        stamp = str(tmp_path / "exited")
        futs = comms.submit(_allreduce_or_die, victim_rank, stamp)
        mine = [f for w, f in zip(comms.worker_addresses, futs) if w != victim]
        distributed.wait(mine, timeout=30)
        took = time.monotonic() - t0
        after_exit = time.time() - float(open(stamp).read())
        assert took < 20, took
        # Gathering them all (the dead worker's task among them, which Dask holds back for a
        # worker of that address) raises the first survivor's error at once.
        with pytest.raises(accord.AccordError, match=victim):
            client.gather(futs)
        client.cancel(futs[victim_rank])
        for f in mine:
            assert f.status == "error", f.status
            e = f.exception()
            assert isinstance(e, accord.AccordError), repr(e)
            assert victim in str(e) and f"rank {victim_rank}" in str(e), str(e)
            assert e.workers.get(victim_rank) == victim
        print(f"survivors' tasks failed {took:.2f} s after submit, {after_exit:.3f} s after the victim exited")
    finally:
        t1 = time.monotonic()
        comms.destroy()
        assert time.monotonic() - t1 < 10
    assert _wait_sessions_gone(client, survivors, comms.session_id, limit=0) == {}

    again = Comms(client=client, timeout=30)
    again.init(workers=survivors)
    try:
        assert again.worker_addresses == survivors
        assert _gather(client, again.submit(_allreduce_sum), 30) == [[3.0] * 4] * 2
    finally:
        again.destroy()


def _pid():
    return os.getpid()


def _allreduce(session_id):
    from accord.dask import local_comm

    x = np.ones(4, np.float32)
    local_comm(session_id).allreduce(x)
    return x.tolist()


def test_destroy_after_worker_died(client, caplog):
    """A worker process is killed; the survivors' collective fails; destroy() in the `finally`
    returns within seconds, raises nothing over that failure (it logs instead), and stops the
    store."""
    import signal

    import accord
    from accord.dask import Comms

    _workers(client)
    comms = Comms(client, timeout=10)
    comms.init()
    store = comms.store_address
    victim = comms.worker_addresses[1]
    os.kill(client.run(_pid, workers=[victim])[victim], signal.SIGKILL)
    survivors = [w for w in comms.worker_addresses if w != victim]
    took = None
    with pytest.raises(accord.AccordError):
        try:
            futs = [client.submit(_allreduce, comms.session_id, workers=[w], pure=False) for w in survivors]
            _gather(client, futs, 30)
        finally:
            t0 = time.monotonic()
            comms.destroy()
            took = time.monotonic() - t0
    assert took is not None and took < 10, took
    assert not comms.initialized
    assert victim in caplog.text, caplog.text
    assert _refused(store)
