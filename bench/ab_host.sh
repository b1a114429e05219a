#!/usr/bin/env bash
# Host benchmark A/B: two accord binaries, interleaved per (op, transport, ranks) sweep with the
# order alternating each round, ranks bound to CPUs. Prints nothing but progress; rows go to OUT
# as "round bin op transport bytes time_us"; bench/ab_ratio.py summarises them.
#   bench/ab_host.sh OLD_BINARY NEW_BINARY OUT [ROUNDS] [SPECS...]
# A spec is "op transport ranks sizes" (default: six collectives x shm/tcp x 2/4 ranks).
set -euo pipefail
old=$1 new=$2 out=$3 rounds=${4:-9}
shift $(( $# < 4 ? $# : 4 ))
specs=("$@")
if [ ${#specs[@]} = 0 ]; then
    for op in allreduce broadcast allgather reduce_scatter alltoall reduce; do
        for tr in shm tcp; do
            for n in 2 4; do
                [ $tr = tcp ] && sizes=4:1M || sizes=4:4M
                specs+=("$op $tr $n $sizes")
            done
        done
    done
fi
: > "$out"
for round in $(seq 1 "$rounds"); do
    if [ $((round % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for spec in "${specs[@]}"; do
        set -- $spec
        for which in $order; do
            bin=$old; [ $which = new ] && bin=$new
            if [ "$2" = tcp ]; then export ACCORD_TRANSPORT=tcp; else unset ACCORD_TRANSPORT; fi
            timeout 120 "$bin" bench "$1" -n "$3" --bind-to cpu --sizes "$4" --factor 16 2>/dev/null \
                | grep -v '^#' \
                | awk -v b=$which -v o="$1" -v t="$2$3" -v r=$round '{print r, b, o, t, $1, $6}' >> "$out"
        done
    done
    echo "round $round done at $(date +%T)"
done
