"""Attaching a CUDA device to a communicator, seen from Python (2 ranks, one GPU each)."""

import pytest

from test_gpu import WORLD, _skip_reason


def test_gpu_device_attachment(run_ranks):
    why = _skip_reason("torch")
    if why:
        pytest.skip(why)
    r = run_ranks(WORLD, "gpu_attach_worker.py", timeout=300)
    print(r.stdout[-6000:])
    print(r.stderr[-6000:])
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    for rank in range(WORLD):
        assert f"ATTACH-OK {rank}" in r.stdout
