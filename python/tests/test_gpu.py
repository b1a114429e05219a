"""GPU arrays (torch CUDA tensors, CuPy arrays) through the NCCL backend, 2 ranks, one GPU each.

Skipped, with the reason, where the framework or two CUDA devices are missing (CI has no GPU).
Ray is not needed (and not used) here.
"""

import importlib.util
import subprocess

import pytest

WORLD = 2


def _cuda_devices():
    """Number of CUDA devices, asked without initialising CUDA in this process."""
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def _skip_reason(framework):
    if importlib.util.find_spec(framework) is None:
        return f"{framework} is not installed"
    found = _cuda_devices()
    if found < WORLD:
        return f"needs {WORLD} CUDA devices (nvidia-smi lists {found})"
    return None


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_gpu_all_operations(framework, run_ranks):
    why = _skip_reason(framework)
    if why:
        pytest.skip(why)
    r = run_ranks(WORLD, "gpu_worker.py", timeout=300, args=[framework])
    print(r.stdout[-6000:])
    print(r.stderr[-6000:])
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    for rank in range(WORLD):
        assert f"GPU-OK {framework} {rank}" in r.stdout


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_gpu_element_types_and_scan_on_one_gpu(framework, run_ranks):
    """One rank: the plumbing of bool, int16 and complex CUDA arrays and of scan to NCCL."""
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    if _cuda_devices() < 1:
        pytest.skip("needs a CUDA device (nvidia-smi lists none)")
    r = run_ranks(1, "gpu_dtypes_worker.py", timeout=300, args=[framework])
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert f"GPU-DTYPES-OK {framework} 0" in r.stdout


@pytest.mark.parametrize("framework", ["torch", "cupy"])
def test_gpu_work_on_the_timeline_and_in_the_flight_record(framework, run_ranks, tmp_path):
    """GPU stream work appears on each rank's timeline with CUDA-event times (one rank, or two
    sharing one GPU through Accord's kernels)."""
    import json

    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    gpus = _cuda_devices()
    if gpus < 1:
        pytest.skip("needs a CUDA device (nvidia-smi lists none)")
    n = 2
    env = {"ACCORD_TRACE": str(tmp_path)}
    if gpus < n:
        env["ACCORD_GPU_ENGINE"] = "accord"  # NCCL needs a GPU per rank; Accord's kernels share one
    r = run_ranks(n, "gpu_trace_worker.py", timeout=300, args=[framework], extra_env=env)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    files = sorted(tmp_path.glob("accord-trace-*-rank*.json"))
    assert len(files) == n, files
    for f in files:
        events = json.load(open(f))["traceEvents"]
        gpu_tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name" and "GPU" in e["args"]["name"]}
        assert len(gpu_tracks) == 1, gpu_tracks
        work = [e for e in events if e["ph"] == "X" and e["tid"] in gpu_tracks]
        assert [e["name"] for e in work] == ["allreduce"] * 4 + ["broadcast"], work
        assert all(e["dur"] > 0 and e["ts"] > 1.6e15 for e in work), work
        host = [e for e in events if e["ph"] == "X" and e["tid"] not in gpu_tracks]
        # Each GPU operation runs after the host issued it (clocks agree to microseconds).
        assert all(w["ts"] + 50 >= min(h["ts"] for h in host) for w in work), (work, host)


def test_gpu_c_handle_nccl_handles_and_cxx_device_code(run_ranks, tmp_path):
    """C++ built with nvcc against <accord/comms.hpp> (the RAFT example, device memory) on a
    lent handle and torch's stream; the NCCL communicator and unique id. One rank per GPU: one
    rank on a machine with one GPU, two where there are two."""
    import os
    import shutil

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    found = _cuda_devices()
    if found < 1:
        pytest.skip("needs a CUDA device (nvidia-smi lists none)")
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc to build the C++ device example")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    lib = str(tmp_path / "libraft_device.so")
    subprocess.run(
        ["nvcc", "-std=c++17", "-x", "cu", "-DACCORD_EXAMPLE_DEVICE", "-DACCORD_EXAMPLE_LIBRARY", "-shared",
         "-Xcompiler", "-fPIC", f"-I{root}/crates/accord-c/include",
         f"{root}/crates/accord-c/examples/raft_allreduce.cpp", "-o", lib],
        check=True, timeout=300,
    )
    world = min(found, WORLD)
    r = run_ranks(world, "gpu_c_handle_worker.py", timeout=300, args=[lib])
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    for rank in range(world):
        assert f"GPU-C-HANDLE-OK {rank}" in r.stdout


def test_gpu_multi_tensor_calls(run_ranks):
    """Ray's multi-GPU calls with a tensor on each of two GPUs per process (2 processes)."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    found = _cuda_devices()
    if found < 2:
        pytest.skip(f"needs 2 CUDA devices (nvidia-smi lists {found})")
    r = run_ranks(2, "gpu_multi_worker.py", timeout=300)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    for rank in range(2):
        assert f"GPU-MULTI-OK {rank}" in r.stdout


def test_gpu_torch_distributed_backend(run_ranks):
    """torch.distributed backend "accord" on CUDA tensors, one GPU per rank."""
    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed")
    found = _cuda_devices()
    if found < 1:
        pytest.skip("needs a CUDA device (nvidia-smi lists none)")
    world = min(found, WORLD)
    r = run_ranks(world, "worker_torch_backend.py", timeout=300, args=["cuda"])
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert r.stdout.count("TORCH-BACKEND-OK cuda") == world, r.stdout
