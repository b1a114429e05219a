#!/usr/bin/env bash
# How far `accord sim --profile` is from measurement: calibrate this machine (or take PROFILE),
# then for each operation and world size run `accord bench` over TCP (one rank per "host") and
# the simulator on the same placement, and print predicted / measured - 1 per size.
#
#   bench/sim_check.sh                          # allreduce broadcast allgather reduce_scatter alltoall, 2 ranks
#   NS="2 4" OPS=allreduce SIZES=4K:64M bench/sim_check.sh
#
# Knobs: OPS, NS, SIZES (4K:64M), FACTOR (4), PROFILE (calibrated here if unset), ACCORD.
# The simulator knows no CPU contention: world sizes beyond the CPUs are not worth checking.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
OPS=${OPS:-"allreduce broadcast allgather reduce_scatter alltoall"}
NS=${NS:-2}
SIZES=${SIZES:-4K:64M}
FACTOR=${FACTOR:-4}
OUT=$(mktemp -d /tmp/accord-simcheck.XXXXXX)
if [ -z "${ACCORD:-}" ]; then
  (cd "$ROOT" && cargo build -q --release -p accord-cli)
  ACCORD=${CARGO_TARGET_DIR:-$ROOT/target}/release/accord
fi
if [ -z "${PROFILE:-}" ]; then
  PROFILE=$OUT/profile.json
  "$ACCORD" bench --calibrate "$PROFILE" -n 2
fi
echo "| op | ranks | bytes | predicted us | measured us | error |"
echo "|---|---|---|---|---|---|"
for op in $OPS; do
  for n in $NS; do
    "$ACCORD" sim "$op" -n "$n" --profile "$PROFILE" --sizes "$SIZES" --factor "$FACTOR" --json "$OUT/sim.json" >/dev/null
    ACCORD_TRANSPORT=tcp ACCORD_BENCH_SYNC=1 "$ACCORD" bench "$op" -n "$n" --sizes "$SIZES" --factor "$FACTOR" --json "$OUT/bench.json" >/dev/null
    python3 - "$OUT/sim.json" "$OUT/bench.json" "$op" "$n" <<'PY'
import json, sys
sim = {r["bytes"]: r["predicted_us"] for r in json.load(open(sys.argv[1]))["rows"]}
for r in json.load(open(sys.argv[2]))["rows"]:
    p = sim.get(r["bytes"])
    if p is None:
        continue
    m = r["time_us"]
    print(f"| {sys.argv[3]} | {sys.argv[4]} | {r['bytes']} | {p:.1f} | {m:.1f} | {100 * (p / m - 1):+.0f}% |")
PY
  done
done
