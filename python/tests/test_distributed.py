"""accord.distributed (redistribute and the distributed FFT) through the launcher, 1-5 ranks."""

import pytest


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_distributed_arrays(run_ranks, n):
    pytest.importorskip("numpy", reason="the checks compare against numpy.fft (pip install numpy)")
    p = run_ranks(n, "worker_distributed.py", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("DIST-OK") == n, p.stdout + p.stderr
