"""`mpirun -n 3` with accord.init(mpi_comm=MPI.COMM_WORLD)."""

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("mpi4py", reason="mpi4py not installed (pip install mpi4py; apt-get install openmpi-bin libopenmpi-dev)")
HERE = os.path.dirname(os.path.abspath(__file__))


def test_mpirun_bootstrap():
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not found (apt-get install openmpi-bin libopenmpi-dev)")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = [mpirun, "-n", "3", "--oversubscribe", sys.executable, os.path.join(HERE, "mpi_worker.py")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd="/")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("MPI-OK") == 3, p.stdout + p.stderr
    # Rank 0 made a token and sent it over MPI: the job is authenticated, so nothing warns.
    assert "no job token" not in p.stderr, p.stderr
