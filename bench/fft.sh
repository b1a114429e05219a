#!/usr/bin/env bash
# Distributed 3-D complex FFT: accord.distributed.fft (bench/fft_accord.py under `accord run`)
# against mpi4py-fft (bench/fft_mpi4py.py under mpirun, FFTW for the local transforms) and
# single-process numpy.fft.fftn (bench/fft_numpy.py), printed as one markdown table
# (bench/fft_table.py) with the ratio accord / mpi4py-fft per round and over the rounds.
#
#   bench/fft.sh SHAPE P ROUNDS DTYPE
#   bench/fft.sh 128,128,128 1,2,4 5 complex128      # P may be a comma list
#   SKIP=accord bench/fft.sh 64,64,64 2 3 complex64
#
# Each round runs every side once per P, accord and mpi4py-fft taking turns going first, and
# numpy once (first in odd rounds, last in even ones); each run prints one JSON line with the
# median over REPS repetitions after WARMUP, and the table shows the median over rounds of those.
# Every side checks its result before timing (bench/fft_mpi4py.py against numpy.fft.fftn).
#
# Knobs: SKIP ("accord mpi4py numpy": sides left out), REPS (20), WARMUP (3), GRID (-1: slab
# decomposition, the input split along axis 0; -1,-1 for pencils; mpi4py-fft only),
# FFT_VENV (~/.cache/accord-baselines/fftvenv: the venv of bench/install_fft_reference.sh,
# which this script runs first when mpi4py-fft is not there), ACCORD (the accord binary;
# default: `accord` on PATH, else built with cargo), ACCORD_PY (the Python that has the accord
# package; default python/.venv/bin/python, else python3), OUT (results folder), IDLE_WAIT
# (0: before each round, wait up to this many seconds for the CPUs to be under 10 % busy).
# Every side is launched its own default way: mpirun binds each rank to a core up to 2 ranks
# and not at all when oversubscribed; `accord run` binds each rank to a CPU when the ranks fill
# or outnumber the CPUs. OMP_NUM_THREADS=1: one thread per rank everywhere.
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n '2,9p' "$0" >&2
  exit 2
fi
SHAPE=$1 PS=$(echo "$2" | tr ',' ' ') ROUNDS=$3 DTYPE=$4
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
SKIP=${SKIP:-}
REPS=${REPS:-20}
WARMUP=${WARMUP:-3}
GRID=${GRID:--1}
IDLE_WAIT=${IDLE_WAIT:-0}
export FFT_VENV=${FFT_VENV:-$HOME/.cache/accord-baselines/fftvenv}
PY=$FFT_VENV/bin/python
OUT=${OUT:-$HOME/.cache/accord-baselines/fft-$(echo "$SHAPE" | tr ',' x)-$DTYPE-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
skip() { case " $SKIP " in *" $1 "*) return 0;; esac; return 1; }

if ! skip mpi4py || ! skip numpy; then
  "$PY" -c 'import mpi4py_fft' 2>/dev/null || "$HERE/install_fft_reference.sh" >&2
fi
if ! skip accord; then
  if [ -z "${ACCORD:-}" ]; then
    if command -v accord >/dev/null 2>&1; then ACCORD=$(command -v accord)
    else
      (cd "$ROOT" && cargo build -q --release -p accord-cli)
      ACCORD=${CARGO_TARGET_DIR:-$ROOT/target}/release/accord
    fi
  fi
  if [ -z "${ACCORD_PY:-}" ]; then
    ACCORD_PY=python3
    [ -x "$ROOT/python/.venv/bin/python" ] && ACCORD_PY=$ROOT/python/.venv/bin/python
  fi
fi

export OMP_NUM_THREADS=1
MPIRUN="mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --mca oob_tcp_if_include lo"
ARGS=(--shape "$SHAPE" --dtype "$DTYPE" --reps "$REPS" --warmup "$WARMUP")
{
  echo "# host: $(uname -srm) | nproc=$(nproc --all) | $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//') | mem=$(free -g | awk '/Mem:/{print $2}')GiB"
  echo "# $(mpirun --version 2>&1 | head -1) | $("$PY" -c 'import mpi4py_fft, mpi4py, numpy; print("mpi4py-fft", mpi4py_fft.__version__, "| mpi4py", mpi4py.__version__, "| numpy", numpy.__version__)' 2>/dev/null || echo 'no mpi4py-fft')"
  echo "# command: SKIP=\"$SKIP\" IDLE_WAIT=$IDLE_WAIT REPS=$REPS WARMUP=$WARMUP GRID=$GRID bench/fft.sh $SHAPE $2 $ROUNDS $DTYPE"
} > "$OUT/machine.txt"

# One run: its stdout (the JSON line) to OUT/<side>-P<p>.r<round>.json, stderr beside it.
run_side() {
  local side=$1 p=$2 r=$3 f="$OUT/$1-P$2.r$3"
  if skip "$side"; then return 0; fi
  echo "== $side P=$p round $r" >&2
  case $side in
    accord) timeout 900 "$ACCORD" run -n "$p" "$ACCORD_PY" "$HERE/fft_accord.py" "${ARGS[@]}" ;;
    mpi4py) timeout 900 $MPIRUN -n "$p" "$PY" "$HERE/fft_mpi4py.py" "${ARGS[@]}" --grid="$GRID" ;;
    numpy) timeout 900 "$PY" "$HERE/fft_numpy.py" "${ARGS[@]}" ;;
  esac > "$f.json" 2> "$f.err" || echo "$side P=$p round $r failed: $(grep -v '^\s*$' "$f.err" | head -1)" >&2
}
# Other work on the machine shows in every number (a rank that shares its core with something
# else holds up the exchanges of all the others). So the table gets, for each round, the share
# of the CPUs busy over one second before it, with nothing of this script running, and the share
# busy during it with anything but this script's runs: the CPU time /proc/stat counts busy
# (steal included: the hypervisor running something else) less what the runs used themselves.
cpu_jiffies() { awk '/^cpu /{print $2+$3+$4+$7+$8+$9, $5+$6}' /proc/stat; }
busy() {
  local a b
  a=$(cpu_jiffies); sleep 1; b=$(cpu_jiffies)
  echo "$a $b" | awk '{u=$3-$1; i=$4-$2; printf "%.2f\n", ((u+i) > 0 ? u/(u+i) : 0)}'
}
children_cpu_s() {  # CHILD_S = user + system seconds of this shell's finished children
  times > "$OUT/times.txt"  # (in this shell: in a $(...) subshell `times` sees the subshell's)
  CHILD_S=$(tail -1 "$OUT/times.txt" | awk '{s=0; for (i=1;i<=2;i++) {split($i,a,/[ms]/); s+=a[1]*60+a[2]}; print s}')
}
HZ=$(getconf CLK_TCK)
: > "$OUT/busy.txt"
for r in $(seq 1 "$ROUNDS"); do
  b=$(busy) waited=0
  while [ "$waited" -lt "$IDLE_WAIT" ] && awk -v b="$b" 'BEGIN{exit !(b > 0.1)}'; do
    sleep 4; waited=$((waited + 5)); b=$(busy)
  done
  children_cpu_s; j0=$(cpu_jiffies) c0=$CHILD_S
  if [ $((r % 2)) -eq 1 ]; then run_side numpy 1 "$r"; fi
  for p in $PS; do
    if [ $((r % 2)) -eq 1 ]; then run_side accord "$p" "$r"; run_side mpi4py "$p" "$r"
    else run_side mpi4py "$p" "$r"; run_side accord "$p" "$r"; fi
  done
  if [ $((r % 2)) -eq 0 ]; then run_side numpy 1 "$r"; fi
  j1=$(cpu_jiffies); children_cpu_s
  echo "$r $b $j0 $j1 $c0 $CHILD_S $HZ" | awk '{busy=($5-$3)/$9; all=busy+($6-$4)/$9;
    other=busy-($8-$7); printf "%d %s %.2f\n", $1, $2, (all > 0 ? (other > 0 ? other : 0)/all : 0)}' \
    >> "$OUT/busy.txt"
done
cat "$OUT/machine.txt"
python3 "$HERE/fft_table.py" "$OUT" | tee "$OUT/table.md"
echo "raw outputs: $OUT" >&2
