"""Every operation, every dtype, world sizes 1..5, through the launcher."""

import pytest


def all_ranks_pass(p, marker, n):
    """Every one of the `n` ranks exited 0 and printed `marker`."""
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count(marker) == n, p.stdout + p.stderr


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_all_operations(run_ranks, n):
    p = run_ranks(n, "worker_ops.py")
    assert p.returncode == 0, p.stdout + p.stderr
    for r in range(n):
        assert f"OK {r} of {n}" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("n", [1, 3])
def test_displacements(run_ranks, n):
    p = run_ranks(n, "worker_displs.py")
    all_ranks_pass(p, "DISPLS-OK", n)


@pytest.mark.parametrize("n", [1, 3])
def test_bad_input(run_ranks, n):
    p = run_ranks(n, "worker_errors.py")
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("ERRORS-OK") == n


def test_bf16_available_or_reason():
    pytest.importorskip("ml_dtypes", reason="bfloat16 via numpy needs ml_dtypes (pip install ml_dtypes)")


def test_cli_help():
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "accord", "--help"], capture_output=True, text=True, timeout=30, cwd="/")
    assert p.returncode == 0 and "run" in p.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_immutable_scalars(run_ranks, n):
    """numpy scalars and Python numbers: results come back as new scalars, never dropped."""
    all_ranks_pass(run_ranks(n, "worker_scalars.py"), "SCALARS-OK", n)


@pytest.mark.parametrize("n", [1, 3])
def test_torch_cpu_tensors(run_ranks, n):
    """CPU tensors of every dtype through the collectives, checked against a reference."""
    pytest.importorskip("torch", reason="torch not installed")
    all_ranks_pass(run_ranks(n, "worker_torch.py"), "TORCH-OK", n)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_object_collectives(run_ranks, n):
    """Pickled objects of every shape through every object call, checked on every rank."""
    all_ranks_pass(run_ranks(n, "worker_objects.py"), "OBJECTS-OK", n)


@pytest.mark.parametrize("n", [2, 3])
def test_init_twice_and_destroy(run_ranks, n):
    """A second init() is refused here; destroy() closes the world and the peers are told."""
    all_ranks_pass(run_ranks(n, "worker_lifetime.py"), "LIFETIME-OK", n)


@pytest.mark.parametrize("n", [1, 3])
def test_nvmath_process_group(run_ranks, n):
    r = run_ranks(n, "worker_nvmath.py", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    for rank in range(n):
        assert f"NVMATH-PG-OK {rank}" in r.stdout
