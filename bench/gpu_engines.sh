#!/usr/bin/env bash
# Accord's GPU engines against NCCL in the same run, alternating: `accord bench OP --device cuda
# --engine nccl|accord|auto` and nccl-tests (plain, and with NCCL's symmetric window
# registration, `-R 2`), several rounds, each round in a different order; bench/gpu_engines.py
# prints the median time per size and the ratios.
#
# Usage: bench/gpu_engines.sh OUTDIR [ROUNDS] [OPS] [SIZES]
#   OPS: "allreduce allgather reduce_scatter alltoall broadcast" by default; SIZES: 8:256M.
#   ACCORD_BIN: the accord binary (default: accord on PATH). NCCL_TESTS: a directory of
#   nccl-tests binaries (all_reduce_perf ...), built against the NCCL Accord loads; without it
#   only Accord's engines run. N: ranks (default: every GPU). FACTOR: size step (2).
# nccl-tests built without MPI run in one process; one thread per GPU (-t N -g 1) is the
# closest to Accord's one process per GPU. With one thread driving every GPU (-g N), small
# calls took about 35 us on four H200s, against 11 us for the same NCCL driven by one process
# per GPU through Accord.
set -uo pipefail
out=$1 rounds=${2:-3}
ops=${3:-"allreduce allgather reduce_scatter alltoall broadcast"}
sizes=${4:-8:256M}
bin=${ACCORD_BIN:-accord}
n=${N:-$(nvidia-smi -L | wc -l)}
fac=${FACTOR:-2}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
mkdir -p "$out"
lo=${sizes%%:*} hi=${sizes##*:}
nccl_tests_name() {
  case $1 in
    allreduce) echo all_reduce_perf ;; allgather) echo all_gather_perf ;;
    reduce_scatter) echo reduce_scatter_perf ;; alltoall) echo alltoall_perf ;;
    broadcast) echo broadcast_perf ;;
  esac
}
run() { # run ROUND OP SIDE
  local r=$1 op=$2 side=$3 f="$out/$op.$side.$r"
  case $side in
    nccl|accord|auto)
      timeout 300 "$bin" bench "$op" -n "$n" --device cuda --engine "$side" --sizes "$sizes" \
        --factor "$fac" --json "$f.json" > "$f.txt" 2>&1 ;;
    nccl-tests|nccl-tests-R2)
      local reg=""; [ $side = nccl-tests-R2 ] && reg="-R 2"
      timeout 300 "$NCCL_TESTS/$(nccl_tests_name "$op")" -b "$lo" -e "$hi" -f "$fac" -t "$n" -g 1 \
        -w 20 -n 100 $reg > "$f.txt" 2>&1 ;;
  esac
}
sides="nccl accord auto"
[ -n "${NCCL_TESTS:-}" ] && sides="nccl-tests nccl-tests-R2 $sides"
# R0: the first round's number (a caller running one round at a time counts on).
r0=${R0:-1}
for r in $(seq "$r0" $((r0 + rounds - 1))); do
  order=$sides
  [ $((r % 2)) = 0 ] && order=$(echo $sides | tr ' ' '\n' | tac | tr '\n' ' ')
  for op in $ops; do
    for side in $order; do run "$r" "$op" "$side"; done
  done
done
[ -n "${NO_SUMMARY:-}" ] || python3 "$(dirname "$0")/gpu_engines.py" "$out"
