#!/usr/bin/env bash
# One comparison run: `accord bench` against OpenMPI (mpi4py, vader shared memory) and
# torch.distributed gloo on the same operations, sizes and world sizes, printed as one table
# with ratio columns (bench/compare_table.py).
#
#   bench/compare.sh                      # allreduce broadcast allgather, N=2 and 4, 4 B..64 MiB
#   OPS="allreduce" NS="2" MAX_BYTES=1M bench/compare.sh
#
# Knobs: OPS, NS, MAX_BYTES (64M), BUDGET (0.5 s per size for the baselines), SKIP ("mpi gloo"),
# ROUNDS (3: Accord and OpenMPI alternate which runs first; each row is the median over rounds;
# gloo, many times slower, runs once),
# BASELINE_STATE (~/.cache/accord-baselines: the Python venv with numpy, mpi4py, torch;
# created on first use, with openmpi-bin from apt if mpirun is missing), OUT (results folder).
# Accord times each call after a barrier (ACCORD_BENCH_SYNC=1), as the baseline scripts do.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
OPS=${OPS:-"allreduce broadcast allgather"}
NS=${NS:-"2 4"}
MAX_BYTES=${MAX_BYTES:-64M}
BUDGET=${BUDGET:-0.5}
SKIP=${SKIP:-}
ROUNDS=${ROUNDS:-3}
STATE=${BASELINE_STATE:-$HOME/.cache/accord-baselines}
OUT=${OUT:-$STATE/compare-$(date +%Y%m%d-%H%M%S)}
PY=$STATE/.venv/bin/python
mkdir -p "$OUT"
skip() { case " $SKIP " in *" $1 "*) return 0;; esac; return 1; }

if ! skip mpi || ! skip gloo; then
  if ! command -v mpirun >/dev/null 2>&1 && ! skip mpi; then
    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin libopenmpi-dev
  fi
  [ -x "$PY" ] || python3 -m venv "$STATE/.venv"
  "$PY" -c "import numpy, mpi4py" 2>/dev/null || "$PY" -m pip install -q numpy mpi4py
  skip gloo || "$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q torch
fi

(cd "$ROOT" && cargo build -q --release -p accord-cli)
ACCORD=${CARGO_TARGET_DIR:-$ROOT/target}/release/accord
export OMP_NUM_THREADS=1 GLOO_SOCKET_IFNAME=lo
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo"
{
  echo "# host: $(uname -srm) | nproc=$(nproc --all) | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//') | mem=$(free -g | awk '/Mem:/{print $2}')GiB"
  echo "# $(mpirun --version 2>&1 | head -1) | $("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null || echo 'no torch')"
  echo "# last-level cache: $(cat /sys/devices/system/cpu/cpu0/cache/index3/size 2>/dev/null || echo unknown)"
} > "$OUT/machine.txt"

# The state of the machine before each round. The memory floor of the large rows: every rank
# copies 64 MiB at once with the collectives' streaming copy; its busbw is the machine's copy
# bandwidth (compare_table.py turns it into the least time the bytes of a row need to reach
# memory). And a two-rank barrier, which takes one cache-line transfer each way between two
# cores: on a VM it shows where the vCPUs sit at the time (0.2 us on neighbouring cores, several
# times that when the host has put them far apart, which slows every transfer between them).
# The copies start together (ACCORD_BENCH_SYNC=1: a barrier before each), on every CPU up to 8.
COPIERS=$(( $(nproc) < 8 ? $(nproc) : 8 ))
run_probe() {
  { ACCORD_BENCH_SYNC=1 "$ACCORD" bench copy -n "$COPIERS" --sizes 64M:64M
    "$ACCORD" bench barrier -n 2; } > "$OUT/probe.r$1.txt" || echo "probe failed" >&2
}
run_accord() {
  for op in $OPS; do
    echo "== accord $op n=$1 round $2" >&2
    ACCORD_BENCH_SYNC=1 "$ACCORD" bench "$op" -n "$1" --sizes "4:$MAX_BYTES" --factor 4 \
      > "$OUT/accord-$op-$1.r$2.txt"
  done
}
run_mpi() {
  skip mpi && return 0
  echo "== mpi n=$1 round $2" >&2
  timeout 900 $MPIRUN -n "$1" "$PY" "$HERE/mpi_allreduce.py" --ops "$(echo $OPS | tr ' ' ,)" \
    --budget "$BUDGET" --max-bytes "$MAX_BYTES" > "$OUT/mpi-$1.r$2.txt" || echo "mpi n=$1 failed" >&2
}
for n in $NS; do
  for r in $(seq 1 "$ROUNDS"); do
    run_probe "$n.$r"
    if [ $((r % 2)) -eq 1 ]; then run_accord "$n" "$r"; run_mpi "$n" "$r"
    else run_mpi "$n" "$r"; run_accord "$n" "$r"; fi
  done
  if ! skip gloo; then
    echo "== gloo n=$n" >&2
    timeout 900 "$PY" "$HERE/gloo_allreduce.py" -n "$n" --ops "$(echo $OPS | tr ' ' ,)" \
      --budget "$BUDGET" --max-bytes "$MAX_BYTES" > "$OUT/gloo-$n.txt" || echo "gloo n=$n failed" >&2
  fi
done
cat "$OUT/machine.txt"
python3 "$HERE/compare_table.py" "$OUT" | tee "$OUT/table.md"
echo "raw outputs: $OUT" >&2
