"""A real Dask LocalCluster (3 worker processes) running collectives through accord.dask."""

import numpy as np
import pytest

distributed = pytest.importorskip("distributed", reason="dask.distributed not installed (pip install 'dask[distributed]')")


def _task(session_id, rank):
    from accord.dask import local_comm

    comm = local_comm(session_id)
    assert comm.rank == rank
    x = np.full(5, comm.rank + 1, np.float64)
    comm.allreduce(x)
    out = np.zeros(comm.size, np.int32)
    comm.allgather(np.array([comm.rank * 10], np.int32), out)
    return x.tolist(), out.tolist()


def test_dask_comms():
    from accord.dask import Comms

    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster, timeout=60) as client:
            client.wait_for_workers(3, timeout=60)
            comms = Comms(client, timeout=60)
            comms.init()
            try:
                futs = [
                    client.submit(_task, comms.session_id, comms.worker_rank(w), workers=[w], pure=False)
                    for w in comms.worker_addresses
                ]
                res = client.gather(futs)
                assert [r[0] for r in res] == [[6.0] * 5] * 3
                assert all(r[1] == [0, 10, 20] for r in res)
            finally:
                comms.destroy()


def _pid():
    import os

    return os.getpid()


def _allreduce(session_id):
    from accord.dask import local_comm

    x = np.ones(4, np.float32)
    local_comm(session_id).allreduce(x)
    return x.tolist()


def test_destroy_after_worker_died(caplog):
    """A worker process is killed; the survivors' collective fails; destroy() in the `finally`
    returns within seconds, raises nothing over that failure (it logs instead), and stops the
    store."""
    import os
    import signal
    import socket
    import time

    import accord
    from accord.dask import Comms

    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster, timeout=60) as client:
            client.wait_for_workers(3, timeout=60)
            comms = Comms(client, timeout=10)
            comms.init()
            port = comms._server.port
            victim = comms.worker_addresses[1]
            os.kill(client.run(_pid, workers=[victim])[victim], signal.SIGKILL)
            survivors = [w for w in comms.worker_addresses if w != victim]
            took = None
            with pytest.raises(accord.AccordError):
                try:
                    futs = [client.submit(_allreduce, comms.session_id, workers=[w], pure=False) for w in survivors]
                    client.gather(futs)
                finally:
                    t0 = time.monotonic()
                    comms.destroy()
                    took = time.monotonic() - t0
            assert took is not None and took < 10, took
            assert not comms.initialized and comms._server is None
            assert victim in caplog.text, caplog.text
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
