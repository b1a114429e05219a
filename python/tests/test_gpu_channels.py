"""Symmetric heap, memory channels and run-time kernels on GPUs (CuPy), 2 and 3 ranks.

Ranks may share one GPU. Skipped, with the reason, without CuPy or a CUDA device (CI has none).
"""

import importlib.util
import subprocess

import pytest


def _devices():
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


@pytest.mark.parametrize("world", [2, 3])
def test_channels_and_kernels(world, run_ranks):
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("cupy is not installed")
    if _devices() == 0:
        pytest.skip("no CUDA device (nvidia-smi lists none)")
    r = run_ranks(world, "gpu_channels_worker.py", timeout=300)
    print(r.stdout[-6000:])
    print(r.stderr[-6000:])
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    for rank in range(world):
        assert f"CHANNELS-OK {rank}" in r.stdout


def test_a_killed_rank_is_named_by_the_waiting_peer(run_ranks):
    if importlib.util.find_spec("cupy") is None:
        pytest.skip("cupy is not installed")
    if _devices() == 0:
        pytest.skip("no CUDA device (nvidia-smi lists none)")
    r = run_ranks(2, "gpu_channels_worker.py", timeout=120, args=["kill"])
    print(r.stdout[-4000:])
    print(r.stderr[-4000:])
    assert "KILL-OK 0" in r.stdout, (r.stdout[-3000:], r.stderr[-3000:])
