#!/usr/bin/env bash
# What one small call costs a rank in user space: allocations (valgrind's dhat) and
# instructions (callgrind), from runs of N1 and N2 calls of 16 floats between 2 ranks over TCP,
# divided by the difference. Waits sleep at once (ACCORD_TCP_POLL_US=0) unless POLL_US says
# otherwise: a wait that polls reads its peer's socket itself (the default), and how long it
# polls depends on timing, so its instruction counts do too.
#
#   bench/per_call.sh                    # allreduce
#   OP=broadcast N1=1000 N2=3000 bench/per_call.sh   # or allgather, alltoall
#   POLL_US=50 bench/per_call.sh         # waits as by default
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OP=${OP:-allreduce} N1=${N1:-1000} N2=${N2:-3000} POLL_US=${POLL_US:-0}
command -v valgrind >/dev/null || { echo "per_call.sh: needs valgrind" >&2; exit 1; }
(cd "$ROOT" && cargo build -q --release -p accord-cli --bins --examples)
T=${CARGO_TARGET_DIR:-$ROOT/target}/release
OUT=$(mktemp -d /tmp/accord-per-call.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
run() { # TOOL N: both ranks under valgrind's TOOL, N calls
  OP=$OP N=$2 ACCORD_TRANSPORT=tcp ACCORD_TCP_POLL_US=$POLL_US ACCORD_TIMEOUT=120 \
    "$T/accord" run -n 2 --no-prefix valgrind --tool="$1" \
    --"$1"-out-file="$OUT/$1.$2.%p" "$T/examples/small_calls" > "$OUT/run.log" 2>&1 ||
    { echo "per_call.sh: the $1 run of $2 calls failed:" >&2; tail -20 "$OUT/run.log" >&2; exit 1; }
}
for n in "$N1" "$N2"; do run dhat "$n"; run callgrind "$n"; done
python3 - "$OUT" "$N1" "$N2" <<'PY'
import glob, json, sys
out, n1, n2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def blocks(n):
    return sum(sum(p["tbk"] for p in json.load(open(f))["pps"]) for f in glob.glob(f"{out}/dhat.{n}.*"))
def instructions(n):
    total = 0
    for f in glob.glob(f"{out}/callgrind.{n}.*"):
        total += next(int(l.split()[1]) for l in open(f) if l.startswith("summary:"))
    return total
calls = 2 * (n2 - n1)  # both ranks
print(f"per call and rank: {(blocks(n2) - blocks(n1)) / calls:.2f} allocations, "
      f"{(instructions(n2) - instructions(n1)) / calls:.0f} instructions (user space)")
PY
