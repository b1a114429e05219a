#!/usr/bin/env bash
# GPU checks of the frameworks that bootstrap from Accord, on a machine without network:
#   1. nvmath-python: nvmath.distributed.initialize(device_id, accord.nvmath.ProcessGroup(comm))
#      at 2 ranks, one GPU each (NCCL backend through nccl4py; NVSHMEM's wheel is too large to carry).
#   2. Ray actors on GPUs using accord.collective (only where Ray is importable).
#   3. The torch.distributed backend on CUDA tensors (stream-semantics Work.wait, device
#      batch_isend_irecv), as test_gpu.py runs it.
# Each prints "ok", or "SKIPPED: why", or "FAILED" with its log; the exit status is 1 on a failure.
#
#   python/tests/gpu_frameworks_check.sh
#   PY: the interpreter (default /opt/torch/.venv/bin/python); WHEELS: a directory of wheels to
#   install first, without network or dependencies, into a private directory put on PYTHONPATH
#   (default .whl/frameworks, which git ignores; an accord wheel there is installed too); LOGS:
#   where the logs go.
set -uo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-/opt/torch/.venv/bin/python}
WHEELS=${WHEELS:-.whl/frameworks}
LOGS=${LOGS:-/tmp/accord-gpu-frameworks}
mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ACCORD_TIMEOUT=${ACCORD_TIMEOUT:-120}
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  site="$LOGS/site"
  rm -rf "$site"
  "$PY" -m pip install -q --no-index --no-deps --target "$site" "$WHEELS"/*.whl || { echo "cannot install the wheels of $WHEELS"; exit 1; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
failed=0
check() { # check NAME SECONDS COMMAND...
  local name=$1 t=$2; shift 2
  timeout "$t" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  if [ $rc = 0 ]; then echo "$name: ok"; else failed=1; echo "$name: FAILED (exit $rc, see $LOGS/$name.log)"; tail -20 "$LOGS/$name.log"; fi
}
skip() { echo "$1: SKIPPED: $2"; }
have() { "$PY" -c "import $1" > /dev/null 2>&1; }

if ! have accord; then echo "accord is not importable by $PY (put its wheel in $WHEELS)"; exit 1; fi
if [ "$gpus" -lt 2 ]; then
  skip nvmath "needs 2 GPUs (nvidia-smi lists $gpus): NCCL takes one GPU per rank"
elif ! have nvmath.distributed; then
  skip nvmath "nvmath-python is not importable (carry its wheels in $WHEELS)"
elif ! have cupy; then
  skip nvmath "cupy is not importable"
else
  check nvmath 300 "$PY" -m accord run -n 2 "$PY" python/tests/gpu_nvmath_worker.py
  if [ "$(grep -c GPU-NVMATH-OK "$LOGS/nvmath.log")" != 2 ]; then
    failed=1; echo "nvmath: FAILED (not both ranks printed GPU-NVMATH-OK, see $LOGS/nvmath.log)"
  fi
fi
if [ "$gpus" -lt 2 ]; then
  skip ray "needs 2 GPUs (nvidia-smi lists $gpus)"
elif ! have ray; then
  skip ray "Ray is not importable (ray 2.60's cp312 wheel alone is 79 MB, over what can be carried)"
else
  check ray 300 "$PY" python/tests/gpu_ray_check.py
fi
if [ "$gpus" -lt 1 ]; then
  skip torch_backend "needs a GPU"
else
  check torch_backend 300 "$PY" -m accord run -n "$(( gpus >= 2 ? 2 : 1 ))" "$PY" python/tests/worker_torch_backend.py cuda
fi
exit $failed
