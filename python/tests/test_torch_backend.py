"""torch.distributed with backend "accord" (CPU tensors), as a torch user runs it: every op on
1-5 ranks under `accord run` (which sets torchrun's variables), async work, a DDP step whose
gradients match one process's, a desync and a killed rank that fail within seconds."""

import os
import subprocess
import sys
import time

import pytest

from conftest import HERE

pytest.importorskip("torch", reason="torch not installed (pip install torch)")


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_every_op(run_ranks, n):
    r = run_ranks(n, "worker_torch_backend.py", timeout=300, args=["ops"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("TORCH-BACKEND-OK ops") == n, r.stdout


@pytest.mark.parametrize("how", ["init_method", "store"])
def test_explicit_init_method_and_store(run_ranks, how):
    r = run_ranks(2, "worker_torch_backend.py", timeout=300, args=["ops", how])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("TORCH-BACKEND-OK ops") == 2, r.stdout


def test_under_torchrun():
    """torchrun's own launcher and rendezvous (not accord run's)."""
    env = dict(os.environ, ACCORD_TIMEOUT="60")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
           os.path.join(HERE, "worker_torch_backend.py"), "ops"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd="/")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("TORCH-BACKEND-OK ops") == 3, r.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_ddp_gradients_match_one_process(run_ranks, n):
    r = run_ranks(n, "worker_torch_backend.py", timeout=300, args=["ddp"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("TORCH-BACKEND-OK ddp") == n, r.stdout


def test_mismatched_shapes_are_a_desync_error(run_ranks):
    r = run_ranks(2, "worker_torch_backend.py", timeout=120, args=["desync"])
    assert r.stdout.count("TORCH-DESYNC-RAISED") == 2, r.stdout[-3000:] + r.stderr[-3000:]


def test_a_killed_rank_fails_the_others_within_seconds(run_ranks):
    t0 = time.monotonic()
    r = run_ranks(3, "worker_torch_backend.py", timeout=120, args=["kill"])
    took = time.monotonic() - t0
    lost = [line for line in r.stdout.splitlines() if "TORCH-PEER-LOST" in line]
    assert len(lost) == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert all("rank 2" in line for line in lost), lost
    assert took < 40, f"took {took:.1f} s (the timeout is 60 s: the loss was not noticed)"


@pytest.mark.parametrize("n", [2, 4, 5])
def test_split_group(run_ranks, n):
    """dist.split_group: disjoint groups, a rank order other than the parent's, ranks in no
    group, a split of a split, messages and objects in the groups."""
    r = run_ranks(n, "worker_torch_backend.py", timeout=300, args=["split"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert r.stdout.count("TORCH-BACKEND-OK split") == n, r.stdout
    assert r.stdout.count("in no split group") == (1 if n == 4 else 0), r.stdout
