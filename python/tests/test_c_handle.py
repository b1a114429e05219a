"""C++ code compiled against <accord/comms.hpp> running on a Python communicator's lent handle
(`Communicator.c_handle()`), loaded with ctypes: on one rank, under the launcher, and inside
Dask workers. The C++ files are the repo's RAFT example and its every-collective check; built
here with g++ as shared libraries that link no Accord of their own."""

import ctypes
import os
import shutil
import subprocess

import numpy as np
import pytest

import accord
from conftest import HERE, launch

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
INCLUDE = os.path.join(ROOT, "crates", "accord-c", "include")
SOURCES = {
    "raft": ("crates/accord-c/examples/raft_allreduce.cpp", "-DACCORD_EXAMPLE_LIBRARY"),
    "every": ("crates/accord-c/tests/cpp/every_collective.cpp", "-DACCORD_TEST_LIBRARY"),
}


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine: the C++ extensions cannot be built")
    out = tmp_path_factory.mktemp("cxx")
    paths = {}
    for name, (src, define) in SOURCES.items():
        path = str(out / f"lib{name}.so")
        cmd = ["g++", "-std=c++17", "-O1", "-shared", "-fPIC", define, f"-I{INCLUDE}", os.path.join(ROOT, src), "-o", path]
        subprocess.run(cmd, check=True, timeout=300)
        paths[name] = path
    return paths


def _one_rank():
    server = accord.StoreServer("127.0.0.1", 0)
    return accord.init_from_store(0, 1, f"127.0.0.1:{server.port}", server.token, timeout=20, store=server)


def _call(path, func, comm):
    lib = ctypes.CDLL(path)
    f = getattr(lib, func)
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_void_p] + ([ctypes.c_void_p] if func == "accord_example_allreduce" else [])
    args = [comm.c_handle()] + ([None] if func == "accord_example_allreduce" else [])
    return f(*args)


def test_the_handle_is_stable_and_lent(libs):
    comm = _one_rank()
    h = comm.c_handle()
    assert isinstance(h, int) and h != 0 and comm.c_handle() == h
    assert _call(libs["raft"], "accord_example_allreduce", comm) == 1
    assert _call(libs["every"], "accord_every_collective", comm) == 0
    # Python still owns the communicator: it works after the C++ code is done with it.
    x = np.ones(3)
    comm.allreduce(x)
    assert x.tolist() == [1.0, 1.0, 1.0]


def test_nccl_handles_need_an_attached_gpu():
    comm = _one_rank()
    for f in (comm.nccl_comm, comm.nccl_unique_id):
        with pytest.raises(RuntimeError, match="no GPU is attached"):
            f()


def test_under_the_launcher(libs):
    r = launch(3, "worker_c_handle.py", args=[libs["raft"], libs["every"]], timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("c_handle ok") == 3, r.stdout


def _dask_task(session_id, raft, every):
    from accord.dask import local_comm

    comm = local_comm(session_id)
    return comm.rank, _call(raft, "accord_example_allreduce", comm), _call(every, "accord_every_collective", comm)


def test_inside_dask_workers(libs):
    distributed = pytest.importorskip("distributed", reason="dask.distributed not installed (pip install 'dask[distributed]')")
    from accord.dask import Comms

    with distributed.LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster, timeout=60) as client:
            client.wait_for_workers(3, timeout=60)
            comms = Comms(client, timeout=60)
            comms.init()
            try:
                futs = [
                    client.submit(_dask_task, comms.session_id, libs["raft"], libs["every"], workers=[w], pure=False)
                    for w in comms.worker_addresses
                ]
                res = sorted(client.gather(futs))
                assert res == [(0, 1, 0), (1, 1, 0), (2, 1, 0)], res
            finally:
                comms.destroy()
