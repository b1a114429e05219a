#!/usr/bin/env bash
# The GPU test suites, on a machine with CUDA (and NCCL for the NCCL engine): each suite runs
# under the launcher in its own job, the tests that end or confuse ranks on purpose (killed
# rank, desync) in jobs of their own, with a time limit each. CI has no GPU; there every GPU
# test prints why it skips, and this script is not needed.
#
#   ./test_gpu.sh [N]     N ranks (default: one per GPU, at least 2; ranks may share a GPU,
#                         where only Accord's own kernels run)
#   ACCORD_BIN, TESTS: a prebuilt accord binary and a directory of prebuilt test binaries
#   (gpu_own_kernels, gpu_collectives, gpu_fft_lines, gpu_distributed, ...), e.g. carried to a machine without
#   Rust; without them the script builds both. LOGS: where each job's output goes (default /tmp/accord-gpu-logs).
#   JOBS="own_kernels symmetric ...": run only the jobs named (the names this script prints).
set -uo pipefail
cd "$(dirname "$0")"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
n=${1:-$(( gpus > 2 ? gpus : 2 ))}
logs=${LOGS:-/tmp/accord-gpu-logs}
mkdir -p "$logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -z "${TESTS:-}" ]; then
  cargo build --release -p accord-cli -p accord --tests >/dev/null || exit 1
  TESTS=$(mktemp -d)
  for t in gpu_own_kernels gpu_collectives gpu_unified gpu_symmetric gpu_kernels gpu_fft_lines gpu_distributed; do
    ln -s "$(pwd)/$(ls -t target/release/deps/$t-* | grep -v '\.d$' | head -1)" "$TESTS/$t"
  done
  ACCORD_BIN=${ACCORD_BIN:-target/release/accord}
fi
A=${ACCORD_BIN:-accord}
failed=0
job() { # job NAME SECONDS COMMAND...
  local name=$1 t=$2; shift 2
  if [ -n "${JOBS:-}" ] && [[ " $JOBS " != *" $name "* ]]; then return; fi
  local t0=$SECONDS
  timeout "$t" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  [ $rc = 0 ] || failed=1
  local skipped
  skipped=$(grep -c "skipping:" "$logs/$name.log")
  if [ $rc != 0 ]; then
    echo "$name: FAILED (exit $rc after $((SECONDS - t0)) s, see $logs/$name.log)"
  elif [ "$skipped" != 0 ]; then
    echo "$name: ok in $((SECONDS - t0)) s, $skipped skipped: $(grep -m1 -o 'skipping: .*' "$logs/$name.log")"
  else
    echo "$name: ok in $((SECONDS - t0)) s"
  fi
}
own() { # Accord's kernels forced, rounds small enough that large counts take many of them
  local name=$1 filter=$2; shift 2
  job "$name" 600 env ACCORD_GPU_ENGINE=accord ACCORD_GPU_CHUNK_BYTES=65536 "$@" \
    "$A" run -n "$n" "$TESTS/gpu_own_kernels" --test-threads 1 --nocapture "$filter"
}
own own_kernels processes_
own own_desync processes_desync_is_named_before_any_output_is_written ACCORD_GPU_DESYNC_TEST=1
own own_killed_rank processes_rank_killed ACCORD_GPU_KILL_TEST=1
job symmetric 600 "$A" run -n "$n" "$TESTS/gpu_symmetric" --test-threads 1 --nocapture processes_
job kernels 300 "$TESTS/gpu_kernels" --test-threads 1 --nocapture
job fft_lines 300 "$TESTS/gpu_fft_lines" --nocapture
job distributed_1 300 "$A" run -n 1 "$TESTS/gpu_distributed" --test-threads 1 --nocapture processes_
if [ "$gpus" -ge "$n" ]; then  # one GPU per rank: NCCL, and both engines
  # Lowered types on Accord's kernels: the calls they lack (reduce) fall back to NCCL.
  job lowered_types 300 env ACCORD_GPU_ENGINE=accord "$A" run -n "$n" "$TESTS/gpu_unified" \
    --test-threads 1 --nocapture processes_lowered_types
  for e in nccl auto; do
    export ACCORD_GPU_ENGINE=$e
    job "collectives_$e" 600 "$A" run -n "$n" "$TESTS/gpu_collectives" --test-threads 1 --nocapture processes_
    job "killed_rank_$e" 120 env ACCORD_GPU_KILL_TEST=1 "$A" run -n "$n" "$TESTS/gpu_collectives" --test-threads 1 --nocapture processes_rank_killed
    job "desync_$e" 120 env ACCORD_GPU_DESYNC_TEST=1 "$A" run -n "$n" "$TESTS/gpu_collectives" --test-threads 1 --nocapture processes_desync
    job "unified_$e" 600 "$A" run -n "$n" "$TESTS/gpu_unified" --test-threads 1 --nocapture processes_
  done
  export ACCORD_GPU_ENGINE=auto
  own own_auto processes_ ACCORD_GPU_ENGINE=auto
  own heap_desync processes_desync_when ACCORD_GPU_ENGINE=auto ACCORD_GPU_DESYNC_TEST=1
  job distributed 600 "$A" run -n "$n" "$TESTS/gpu_distributed" --test-threads 1 --nocapture processes_
  job sigkill 300 "$TESTS/gpu_collectives" --test-threads 1 --nocapture sigkill_
  job threads 600 "$TESTS/gpu_collectives" --test-threads 1 --nocapture threads_
else
  echo "NCCL suites skipped: $n ranks on $gpus GPU(s) (NCCL needs one GPU per rank)"
fi
exit $failed
