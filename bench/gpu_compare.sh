#!/usr/bin/env bash
# Accord's GPU collectives against torch.distributed (NCCL) in the same run, same sizes, same
# timing method; prints busbw ratios (accord / torch) and latency ratios (torch / accord).
#
# Usage: bench/gpu_compare.sh [NRANKS] [OUTDIR]     (ACCORD_BIN: the accord binary;
#        ACCORD_COMPARE_OPS="alltoall ...": a subset of the operations; ROUNDS=3;
#        MIN_BYTES / MAX_BYTES: the size range, 8 B to 512 MiB by default)
set -euo pipefail
n=${1:-$(nvidia-smi -L | wc -l)}
out=${2:-/tmp/accord-gpu-compare}
bin=${ACCORD_BIN:-target/release/accord}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
# Compare like with like: load the NCCL that PyTorch uses (its nvidia-nccl wheel) unless told.
if [ -z "${ACCORD_NCCL_LIBRARY:-}" ]; then
  lib=$(python3 -c 'import importlib.util, os
s = importlib.util.find_spec("nvidia.nccl")
p = [os.path.join(d, "lib", "libnccl.so.2") for d in (s.submodule_search_locations or [])] if s else []
print(next((x for x in p if os.path.exists(x)), ""))' 2>/dev/null || true)
  [ -n "$lib" ] && export ACCORD_NCCL_LIBRARY=$lib
fi
echo "# accord loads NCCL from ${ACCORD_NCCL_LIBRARY:-the default search order}"
lo=${MIN_BYTES:-8}; hi=${MAX_BYTES:-$((512 << 20))}; fac=4
ops=${ACCORD_COMPARE_OPS:-"allreduce allgather reduce_scatter alltoall broadcast"}
export ACCORD_COMPARE_OPS="$ops"
# Several rounds in alternating order (accord first, then torch first, ...): whichever side runs
# first on a cold GPU is not favoured, and each row is the median over rounds for both sides.
rounds=${ROUNDS:-3}
run_accord() {
  for op in $ops; do
    "$bin" bench "$op" --device cuda -n "$n" --sizes "$lo:$hi" --factor "$fac" \
      --json "$out/accord_${op}_$1.json" > "$out/accord_${op}_$1.txt"
  done
}
run_torch() {
  python3 "$here/nccl_torch.py" "$n" "$out/torch_$1.json" "$lo" "$hi" "$fac" > "$out/torch_$1.txt" 2>&1 || {
    cat "$out/torch_$1.txt"; exit 1; }
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then run_accord "$r"; run_torch "$r"; else run_torch "$r"; run_accord "$r"; fi
done
python3 - "$out" "$rounds" $ops <<'PY'
import json, statistics, sys
out, rounds, ops = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
runs = range(1, rounds + 1)
torch = [json.load(open(f"{out}/torch_{r}.json")) for r in runs]
print(f"# ranks={torch[0]['ranks']} torch nccl={torch[0]['nccl']} torch={torch[0]['torch']} "
      f"rounds={rounds} (alternating order; median time per side)")
print(f"{'op':15s} {'bytes':>10s} {'accord us':>10s} {'torch us':>10s} {'accord bw':>10s} "
      f"{'torch bw':>10s} {'ratio':>7s} {'per-round ratios':>18s}")
print("# ratio = torch time / accord time = accord busbw / torch busbw (same bytes); > 1: accord faster")
summary = []
for op in ops:
    acc = [{x["bytes"]: x for x in json.load(open(f"{out}/accord_{op}_{r}.json"))["rows"]} for r in runs]
    wrong = sum(x["wrong"] for a in acc for x in a.values())
    for t0 in (x for x in torch[0]["rows"] if x["op"] == op):
        b = t0["bytes"]
        ts = [next(x for x in t["rows"] if x["op"] == op and x["bytes"] == b) for t in torch]
        if any(b not in a for a in acc):
            continue
        a_us = statistics.median(a[b]["time_us"] for a in acc)
        t_us = statistics.median(x["time_us"] for x in ts)
        per = [x["time_us"] / a[b]["time_us"] for x, a in zip(ts, acc)]
        ratio = t_us / a_us
        a_bw = statistics.median(a[b]["busbw_gbps"] for a in acc)
        t_bw = statistics.median(x["busbw_gbps"] for x in ts)
        summary.append((op, b, ratio))
        spread = f"{min(per):.2f}-{max(per):.2f}"
        print(f"{op:15s} {b:10d} {a_us:10.1f} {t_us:10.1f} {a_bw:10.1f} {t_bw:10.1f} {ratio:7.3f} {spread:>18s}")
    if wrong:
        print(f"!! accord {op}: {wrong} wrong elements")
big = [x for op, b, x in summary if b >= 1 << 20]
small = [x for op, b, x in summary if b <= 64 << 10]
if big:
    print(f"# busbw ratio accord/torch from 1 MiB: min {min(big):.3f}, mean {sum(big)/len(big):.3f}")
if small:
    print(f"# latency ratio torch/accord up to 64 KiB: min {min(small):.3f}, mean {sum(small)/len(small):.3f}")
PY
