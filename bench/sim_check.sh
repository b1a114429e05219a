#!/usr/bin/env bash
# How far `accord sim --profile` is from measurement: calibrate this machine (or take PROFILE),
# then for each operation and world size run `accord bench` over TCP (one rank per "host") and
# the simulator on the same placement, and print predicted / measured - 1 per size.
#
#   bench/sim_check.sh                          # allreduce broadcast allgather reduce_scatter alltoall, 2 ranks
#   NS="2 4" OPS=allreduce SIZES=4K:64M bench/sim_check.sh
#   NS= LAYOUTS="2x2 4x2" bench/sim_check.sh    # hosts x ranks as network namespaces (root)
#   KEEP=run1 bench/sim_check.sh                # also keep the profiles and every measurement
#   FROM=run1 bench/sim_check.sh                # price run1's measurements again, measuring nothing
#
# Knobs: OPS, NS, LAYOUTS (none), SIZES (4K:64M), FACTOR (4), ROUNDS (3: the median of that
# many runs per size is compared), PROFILE (calibrated here if
# unset; CROWD=N also times up to N / 2 pairs exchanging at once, which the simulator prices
# crowded rounds with), PROFILE_NS (the profile for LAYOUTS: its TCP costs measured between
# namespaces by `bench/multihost.sh calibrate`, made here if unset), ACCORD, KEEP (a directory
# to keep the profiles and measurements in), FROM (a KEEP directory: its profiles, placements
# and measurements are compared with this build's simulator, so a change to the model can be
# checked against measurements already made; OPS, NS, LAYOUTS, SIZES and FACTOR come from it,
# and its profiles unless PROFILE or PROFILE_NS name others).
# Every rank runs on this machine, so the simulator is told so (`--one-machine`): all network
# messages of a round compete. World sizes beyond the CPUs are not worth checking.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
OPS=${OPS:-"allreduce broadcast allgather reduce_scatter alltoall"}
NS=${NS-2}
LAYOUTS=${LAYOUTS:-}
SIZES=${SIZES:-4K:64M}
FACTOR=${FACTOR:-4}
ROUNDS=${ROUNDS:-3}
OUT=$(mktemp -d /tmp/accord-simcheck.XXXXXX)
if [ -z "${ACCORD:-}" ]; then
  (cd "$ROOT" && cargo build -q --release -p accord-cli)
  ACCORD=${CARGO_TARGET_DIR:-$ROOT/target}/release/accord
fi
if [ -n "${FROM:-}" ]; then
  # shellcheck disable=SC1091
  . "$FROM/settings"
  PROFILE=${PROFILE:-$FROM/profile.json}
  [ -z "$LAYOUTS" ] || PROFILE_NS=${PROFILE_NS:-$FROM/profile-ns.json}
fi
if [ -z "${PROFILE:-}" ]; then
  PROFILE=$OUT/profile.json
  "$ACCORD" bench --calibrate "$PROFILE" -n 2 ${CROWD:+--crowd "$CROWD"}
fi
if [ -n "$LAYOUTS" ] && [ -z "${PROFILE_NS:-}" ]; then
  PROFILE_NS=$OUT/profile-ns.json
  OUT=$OUT/calib ACCORD=$ACCORD PROFILE=$PROFILE_NS "$HERE/multihost.sh" calibrate >/dev/null
fi
if [ -n "${KEEP:-}" ] && [ -z "${FROM:-}" ]; then
  mkdir -p "$KEEP"
  cp "$PROFILE" "$KEEP/profile.json"
  [ -z "$LAYOUTS" ] || cp "$PROFILE_NS" "$KEEP/profile-ns.json"
  printf 'OPS="%s"\nNS="%s"\nLAYOUTS="%s"\nSIZES=%s\nFACTOR=%s\n' "$OPS" "$NS" "$LAYOUTS" "$SIZES" "$FACTOR" >"$KEEP/settings"
fi
# measured DIR CMD...: runs CMD (which measures into DIR) unless FROM has DIR's measurements,
# and keeps them under KEEP; prints the directory to compare.
measured() {
  local dir=$1
  shift
  if [ -n "${FROM:-}" ]; then
    echo "$FROM/$dir"
    return
  fi
  rm -rf "${OUT:?}/m"
  mkdir -p "$OUT/m"
  # A command substitution does not stop the script on errors: a failed measurement must.
  "$@" >/dev/null || exit 1
  if [ -n "${KEEP:-}" ]; then
    rm -rf "${KEEP:?}/$dir"
    mkdir -p "$KEEP/$dir"
    cp "$OUT"/m/* "$KEEP/$dir/"
  fi
  echo "$OUT/m"
}
# compare SIM_JSON OP PLACEMENT MEASURED...: each MEASURED is one round's accord bench JSON or,
# for namespace layouts, one round's rank-0 output of bench/multihost.sh; per size the median
# of the rounds is compared.
compare() {
  python3 - "$@" <<'PY'
import json, statistics, sys
sim = {r["bytes"]: r["predicted_us"] for r in json.load(open(sys.argv[1]))["rows"]}
measured = {}
for path in sys.argv[4:]:
    text = open(path).read()
    if text.lstrip().startswith("{"):
        rows = [(r["bytes"], r["time_us"]) for r in json.loads(text)["rows"]]
    else:
        rows = [(int(f[0]), float(f[5])) for f in (l.split() for l in text.splitlines())
                if f and f[0].isdigit()]
    for b, t in rows:
        measured.setdefault(b, []).append(t)
# The benchmark rounds a size down to whole blocks of its ranks (4080 B of allgather over 6
# ranks for 4096); the simulator prices the same blocks at the size asked for.
def predicted(b):
    return sim.get(b, next((p for s, p in sim.items() if 0 <= s - b < 4 * n_ranks), None))
n_ranks = int(sys.argv[3].split()[0]) * (int(sys.argv[3].split()[-1]) if "x" in sys.argv[3] else 1)
for b, ts in sorted(measured.items()):
    p, m = predicted(b), statistics.median(ts)
    if p is not None:
        print(f"| {sys.argv[2]} | {sys.argv[3]} | {b} | {p:.1f} | {m:.1f} | {100 * (p / m - 1):+.0f}% |")
PY
}
: >"$OUT/rows"
echo "| op | placement | bytes | predicted us | measured us | error |"
echo "|---|---|---|---|---|---|"
# bench_rounds N: ROUNDS runs of accord bench on N ranks over TCP, into $OUT/m.
bench_rounds() {
  for round in $(seq "$ROUNDS"); do
    ACCORD_TRANSPORT=tcp ACCORD_BENCH_SYNC=1 "$ACCORD" bench "$op" -n "$1" --sizes "$SIZES" --factor "$FACTOR" --json "$OUT/m/bench.$round.json"
  done
}
# ns_rounds H R: ROUNDS runs over H namespaces of R ranks, rank 0's outputs into $OUT/m.
ns_rounds() {
  rm -f "$OUT"/ns/bench-accord-"$op"-*
  OUT=$OUT/ns ACCORD=$ACCORD HOSTS=$1 RANKS=$2 OPS=$op SIZES=$SIZES FACTOR=$FACTOR ROUNDS=$ROUNDS SKIP="mpi gloo" \
    "$HERE/multihost.sh" bench
  cp "$OUT"/ns/bench-accord-"$op"-*.0 "$OUT/m/"
}
for op in $OPS; do
  for n in $NS; do
    "$ACCORD" sim "$op" -n "$n" --one-machine --profile "$PROFILE" --sizes "$SIZES" --factor "$FACTOR" --json "$OUT/sim.json" >/dev/null
    dir=$(measured "$op-$n" bench_rounds "$n")
    compare "$OUT/sim.json" "$op" "$n ranks, TCP" "$dir"/* | tee -a "$OUT/rows"
  done
  for l in $LAYOUTS; do
    h=${l%x*} r=${l#*x}
    "$ACCORD" sim "$op" -n $((h * r)) --per-host "$r" --one-machine --profile "$PROFILE_NS" --sizes "$SIZES" --factor "$FACTOR" --json "$OUT/sim.json" >/dev/null
    dir=$(measured "$op-$l" ns_rounds "$h" "$r")
    compare "$OUT/sim.json" "$op" "$h hosts x $r" "$dir"/* | tee -a "$OUT/rows"
  done
done
# Rows within 25 % of measured, per placement and in all.
awk -F'|' '{ e = $5 / $6 - 1; ok = (e <= 0.25 && e >= -0.25); p = $3; gsub(/^ +| +$/, "", p)
    n[p]++; k[p] += ok; N++; K += ok }
  END { for (p in n) printf "# %s: %d of %d rows within 25 %%\n", p, k[p], n[p]; printf "# all: %d of %d\n", K, N }' "$OUT/rows" | sort
