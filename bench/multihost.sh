#!/usr/bin/env bash
# Several hosts on one machine: HOSTS Linux network namespaces, each with its own network stack
# (a veth pair to a bridge in the root namespace, MTU 1500) and its own host name (a UTS
# namespace), RANKS ranks in each. Accord places ranks by host identity (host name + boot id),
# so the ranks of one namespace share memory and reach the other namespaces over TCP through
# the veths, as on separate machines, only without a wire's latency (`tc netem` is not
# available here). OpenMPI sees the namespaces as hosts too (its launch agent enters them).
#
#   bench/multihost.sh check     # accord selftest (every operation, type, reduce operator and
#                                # awkward counts, results checked) on each of LAYOUTS
#   bench/multihost.sh bench     # accord bench vs OpenMPI (from C) and gloo, alternating rounds
#   HOSTS=4 RANKS=2 OPS="allreduce allgather" SIZES=4:64M ROUNDS=3 bench/multihost.sh bench
#   PROFILE=ns.json CROWD=8 bench/multihost.sh calibrate
#                                # a profile for `accord sim` whose TCP costs (and, with CROWD=N,
#                                # crowded exchanges over N namespaces) are measured between
#                                # namespaces, through the veths, not over loopback
#
# Needs root (ip netns, veth, bridge) and unshare. Knobs: LAYOUTS (check; hosts x ranks per host,
# `i` suffix: ranks dealt round-robin over hosts, default "2x2 3x2 2x3i 4x1"), HOSTS (2), RANKS
# (2), OPS, SIZES (4:4M), FACTOR (4), ROUNDS (3), SKIP ("mpi gloo"), TRANSPORT (`tcp`: TCP
# between the ranks of a host too, for Accord and OpenMPI alike), ACCORD (binary; built if
# unset), REF (reference drivers: mpicoll.c and gloo_coll.py; default ../shared/bench),
# PYTHON (a Python with torch, for gloo), OUT (results folder), ACCORD_B (settings of a second
# Accord side in the same rounds, e.g. "ACCORD_HIERARCHY=off", or "ACCORD_BIN=path" for another
# build: the table's `accordb` column), VETH_NAPI (`gro`: GRO on and TSO off at both ends of every
# veth, which sends TCP through the veths' NAPI, a receive queue that busy polling,
# ACCORD_TCP_BUSY_POLL_US, can poll, though the sender's CPU mostly empties it at once;
# `threaded`: a kernel thread empties it, as a NIC's interrupt defers the work; needs ethtool).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
MODE=${1:-check}
PFX=acmh
NET=10.213.0
OUT=${OUT:-$(mktemp -d /tmp/accord-multihost.XXXXXX)}
mkdir -p "$OUT"
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }

if [ "$(id -u)" != 0 ] || ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
  echo "multihost: needs root, ip (iproute2) and unshare (util-linux)" >&2
  exit 3
fi
if [ -z "${ACCORD:-}" ]; then
  (cd "$ROOT" && cargo build -q --release -p accord-cli)
  ACCORD=${CARGO_TARGET_DIR:-$ROOT/target}/release/accord
fi

net_down() {
  # The veths first, by hand: a deleted namespace is torn down later by the kernel, and until
  # then its veth's peer here keeps its name.
  for v in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep "^${PFX}v" || true); do
    ip link del "$v" 2>/dev/null || true
  done
  for ns in $(ip netns list | awk '{print $1}' | grep "^${PFX}h" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns"
  done
  ip link del ${PFX}br 2>/dev/null || true
}

# net_up H: namespaces ${PFX}h0..h{H-1} at $NET.10.., the bridge (root namespace) at $NET.1.
net_up() {
  net_down
  ip link add ${PFX}br type bridge
  ip addr add $NET.1/24 dev ${PFX}br
  ip link set ${PFX}br up
  for h in $(seq 0 $(($1 - 1))); do
    ip netns add ${PFX}h$h
    for _ in $(seq 50); do
      ip link add ${PFX}v$h type veth peer name eth0 netns ${PFX}h$h 2>/dev/null && break
      ip link del ${PFX}v$h 2>/dev/null || sleep 0.1
    done
    ip link show ${PFX}v$h >/dev/null
    ip link set ${PFX}v$h master ${PFX}br up
    ip -n ${PFX}h$h addr add $NET.$((10 + h))/24 dev eth0
    ip -n ${PFX}h$h link set eth0 up
    ip -n ${PFX}h$h link set lo up
    if [ -n "${VETH_NAPI:-}" ]; then
      case $VETH_NAPI in gro | threaded) ;; *) echo "multihost: VETH_NAPI is gro or threaded" >&2; exit 2 ;; esac
      command -v ethtool >/dev/null || { echo "multihost: VETH_NAPI needs ethtool" >&2; exit 3; }
      ethtool -K ${PFX}v$h gro on tso off
      ip netns exec ${PFX}h$h ethtool -K eth0 gro on tso off
      if [ "$VETH_NAPI" = threaded ]; then
        echo 1 >/sys/class/net/${PFX}v$h/threaded
        ip netns exec ${PFX}h$h sh -c 'echo 1 >/sys/class/net/eth0/threaded'
      fi
    fi
  done
}
trap net_down EXIT

# on_host H CMD...: run CMD as a process of host H (its network and host name).
on_host() {
  local h=$1
  shift
  ip netns exec ${PFX}h$h unshare --uts sh -c 'hostname "$0"; exec "$@"' ${PFX}h$h "$@"
}

# host_of RANK HOSTS RANKS INTERLEAVED
host_of() { if [ "$4" = 1 ]; then echo $(($1 % $2)); else echo $(($1 / $3)); fi; }
local_of() { if [ "$4" = 1 ]; then echo $(($1 / $2)); else echo $(($1 % $3)); fi; }

# accord_job NAME HOSTS RANKS INTERLEAVED CMD...: one Accord job, CMD per rank; rank r's output
# in $OUT/NAME.r; fails if any rank fails.
accord_job() {
  local name=$1 hosts=$2 ranks=$3 inter=$4
  shift 4
  local n=$((hosts * ranks)) port=$((20000 + RANDOM % 20000))
  local token
  token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
  ACCORD_TOKEN=$token "$ACCORD" store --host $NET.1 --port $port 2>"$OUT/$name.store" &
  local store=$! pids=() r h fail=0
  for r in $(seq 0 $((n - 1))); do
    h=$(host_of $r $hosts $ranks $inter)
    on_host "$h" env ACCORD_RANK=$r ACCORD_WORLD_SIZE=$n ACCORD_LOCAL_RANK=$(local_of $r $hosts $ranks $inter) \
      ACCORD_LOCAL_WORLD_SIZE=$ranks ACCORD_STORE=$NET.1:$port ACCORD_STORE_EXTERNAL=1 \
      ACCORD_TOKEN="$token" ACCORD_HOST=$NET.$((10 + h)) ACCORD_TIMEOUT=120 \
      timeout 900 "$@" >"$OUT/$name.$r" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do wait "${pids[$r]}" || { echo "multihost: $name rank $r failed:" >&2; tail -5 "$OUT/$name.$r" >&2; fail=1; }; done
  kill $store 2>/dev/null || true
  wait $store 2>/dev/null || true
  return $fail
}

# mpi_job HOSTS RANKS CMD...: one OpenMPI job, ranks placed by host (--map-by node would deal).
mpi_job() {
  local hosts=$1 ranks=$2 list="" h
  shift 2
  for h in $(seq 0 $((hosts - 1))); do list+="$NET.$((10 + h)):$ranks,"; done
  local extra=()
  # Ranks that outnumber the CPUs must yield when idle (OpenMPI cannot tell: each "host" has
  # the slots it is given).
  [ $((hosts * ranks)) -gt "$(nproc)" ] && extra+=(--mca mpi_yield_when_idle 1)
  mpirun --allow-run-as-root --oversubscribe -n $((hosts * ranks)) --host "${list%,}" "${extra[@]}" \
    --mca plm rsh --mca plm_rsh_agent "$OUT/netns-agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca oob_tcp_if_include $NET.0/24 --mca btl_tcp_if_include $NET.0/24 \
    --mca btl "$MPI_BTL" --bind-to none "$@"
}

# The launch agent OpenMPI calls as `agent HOST COMMAND...` (as it would call ssh).
write_agent() {
  cat >"$OUT/netns-agent" <<EOF
#!/usr/bin/env bash
while [ "\${1#-}" != "\$1" ]; do shift; done
h=\${1##*.}; shift
exec ip netns exec ${PFX}h\$((h - 10)) unshare --uts sh -c "hostname ${PFX}h\$((h - 10)); \$*"
EOF
  chmod +x "$OUT/netns-agent"
}

# gloo_job HOSTS RANKS OP MIN MAX FACTOR: torch.distributed gloo through the reference driver.
gloo_job() {
  local hosts=$1 ranks=$2 op=$3 lo=$4 hi=$5 fac=$6 n=$(($1 * $2)) r h pids=()
  local port=$((20000 + RANDOM % 20000))
  for r in $(seq 0 $((n - 1))); do
    h=$((r / ranks))
    on_host "$h" env RANK=$r WORLD_SIZE=$n MASTER_ADDR=$NET.10 MASTER_PORT=$port \
      GLOO_SOCKET_IFNAME=eth0 REF="$REF" timeout 900 "$PYTHON" -c \
      'import os, sys; sys.path.insert(0, os.environ["REF"]); import gloo_coll as g; g.worker(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), [sys.argv[1]], *map(int, sys.argv[2:]))' \
      "$op" "$lo" "$hi" "$fac" >"$OUT/gloo.$r" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do wait "${pids[$r]}" || true; done
  cat "$OUT/gloo.0"
}

bytes() { numfmt --from=iec "$1"; }

case "$MODE" in
check)
  for layout in ${LAYOUTS:-2x2 3x2 2x3i 4x1}; do
    inter=0
    case $layout in *i) inter=1 ;; esac
    l=${layout%i}
    hosts=${l%x*} ranks=${l#*x}
    net_up "$hosts"
    echo "== accord selftest: $hosts hosts x $ranks ranks$([ $inter = 1 ] && echo ', ranks dealt round-robin')"
    accord_job "selftest-$layout" "$hosts" "$ranks" "$inter" "$ACCORD" selftest
    n=$((hosts * ranks))
    for r in $(seq 0 $((n - 1))); do
      grep -q "every result right" "$OUT/selftest-$layout.$r" || { echo "multihost: rank $r did not pass" >&2; exit 1; }
    done
    grep -h "tcp+shm\|over tcp" "$OUT/selftest-$layout.0"
  done
  echo "multihost check: passed (logs in $OUT)"
  ;;
bench)
  HOSTS=${HOSTS:-2} RANKS=${RANKS:-2}
  SIZES=${SIZES:-4:4M} FACTOR=${FACTOR:-4} ROUNDS=${ROUNDS:-3}
  OPS=${OPS:-"allreduce broadcast allgather reduce_scatter alltoall"}
  REF=${REF:-$(dirname "$ROOT")/shared/bench}
  lo=$(bytes "${SIZES%:*}") hi=$(bytes "${SIZES#*:}")
  MPI_BTL=self,vader,tcp
  if [ "${TRANSPORT:-}" = tcp ]; then
    export ACCORD_TRANSPORT=tcp
    MPI_BTL=self,tcp
  fi
  net_up "$HOSTS"
  write_agent
  if ! skip mpi; then
    command -v mpicc >/dev/null || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin libopenmpi-dev; }
    mpicc -O2 -o "$OUT/mpicoll" "$REF/mpicoll.c"
  fi
  PYTHON=${PYTHON:-python3}
  if ! skip gloo && ! "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "multihost: no torch in $PYTHON (set PYTHON): gloo skipped" >&2
    SKIP="${SKIP:-} gloo"
  fi
  echo "# $HOSTS hosts x $RANKS ranks${TRANSPORT:+, transport $TRANSPORT}, $(nproc) CPUs, float32; results in $OUT" | tee "$OUT/summary.txt"
  for op in $OPS; do
    for round in $(seq 1 "$ROUNDS"); do
      # Every side takes every place in turn, and follows each other side as often as it
      # precedes it: a second Accord side always run between the other two came out 3-10 %
      # faster or slower than the same binary run first.
      all=(accord ${ACCORD_B:+accordb})
      skip mpi || all+=(mpi)
      k=$(((round - 1) % ${#all[@]}))
      sides="${all[*]:k} ${all[*]:0:k}"
      if [ $(((round - 1) / ${#all[@]} % 2)) = 1 ]; then
        sides=$(printf '%s\n' $sides | tac | tr '\n' ' ')
      fi
      for who in $sides; do
        if [ $who = accord ] || [ $who = accordb ]; then
          (
            # shellcheck disable=SC2086
            [ $who = accordb ] && export $ACCORD_B
            ACCORD_BENCH_SYNC=1 accord_job "bench-$who-$op-$round" "$HOSTS" "$RANKS" 0 \
              "${ACCORD_BIN:-$ACCORD}" bench-rank "$op" --sizes "$lo:$hi" --factor "$FACTOR"
          )
          { echo "## $who $op round $round"; grep -E '^ +[0-9]' "$OUT/bench-$who-$op-$round.0"; } >>"$OUT/summary.txt"
        elif ! skip mpi; then
          { echo "## mpi $op round $round"; mpi_job "$HOSTS" "$RANKS" "$OUT/mpicoll" "$op" "$lo" "$hi" "$FACTOR" | grep -E '^ +[0-9]'; } >>"$OUT/summary.txt"
        fi
      done
    done
    if ! skip gloo; then
      { echo "## gloo $op round 1"; gloo_job "$HOSTS" "$RANKS" "$op" "$lo" "$hi" "$FACTOR" | grep -E '^ +[0-9]'; } >>"$OUT/summary.txt"
    fi
  done
  { head -1 "$OUT/summary.txt"; python3 "$HERE/multihost_table.py" "$OUT/summary.txt"; } | tee "$OUT/table.md"
  if [ "${VETH_NAPI:-}" ]; then
    # Packets that reads took off the veths' queues by busy polling, per namespace.
    for h in $(seq 0 $((HOSTS - 1))); do
      echo "# host $h: $(ip netns exec ${PFX}h$h awk '/^TcpExt:/ { if (!n) n = split($0, k);
        else for (i = 1; i <= n; i++) if (k[i] == "BusyPollRxPackets") print k[i], $i }' /proc/net/netstat)"
    done | tee -a "$OUT/table.md"
  fi
  ;;
calibrate)
  # The calibration's TCP phase between two namespaces (one rank each), its crowd phase over
  # CROWD namespaces, then `accord bench --calibrate` adds this machine's shared-memory phase.
  : "${PROFILE:?set PROFILE (where to write the profile)}"
  net_up "${CROWD:-2}"
  export ACCORD_TRANSPORT=tcp ACCORD_BENCH_SYNC=1
  accord_job calib-tcp 2 1 0 "$ACCORD" bench-rank --calibrate "$OUT/tcp.part" --calibrate-phase tcp
  if [ -n "${CROWD:-}" ]; then
    accord_job calib-crowd "$CROWD" 1 0 "$ACCORD" bench-rank --calibrate "$OUT/crowd.part" --calibrate-phase crowd
  fi
  unset ACCORD_TRANSPORT
  "$ACCORD" bench --calibrate "$PROFILE" -n 2 --network-from "$OUT" ${CROWD:+--crowd "$CROWD"}
  ;;
*)
  echo "usage: bench/multihost.sh check|bench|calibrate" >&2
  exit 2
  ;;
esac
