#!/usr/bin/env bash
# Accord's GPU collectives against torch.distributed (NCCL) in the same run, same sizes, same
# timing method; prints busbw ratios (accord / torch) and latency ratios (torch / accord).
#
# Usage: bench/gpu_compare.sh [NRANKS] [OUTDIR]     (ACCORD_BIN: the accord binary;
#        ACCORD_COMPARE_OPS="alltoall ...": a subset of the operations)
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
lo=8; hi=$((512 << 20)); fac=4
ops=${ACCORD_COMPARE_OPS:-"allreduce allgather reduce_scatter alltoall broadcast"}
export ACCORD_COMPARE_OPS="$ops"
for op in $ops; do
  "$bin" bench "$op" --device cuda -n "$n" --sizes "$lo:$hi" --factor "$fac" --json "$out/accord_$op.json" \
    > "$out/accord_$op.txt"
done
python3 "$here/nccl_torch.py" "$n" "$out/torch.json" "$lo" "$hi" "$fac" > "$out/torch.txt" 2>&1 || {
  cat "$out/torch.txt"; exit 1; }
python3 - "$out" $ops <<'PY'
import json, sys
out, ops = sys.argv[1], sys.argv[2:]
torch = json.load(open(f"{out}/torch.json"))
print(f"# ranks={torch['ranks']} torch nccl={torch['nccl']} torch={torch['torch']}")
print(f"{'op':15s} {'bytes':>10s} {'accord us':>10s} {'torch us':>10s} {'accord bw':>10s} {'torch bw':>10s} {'ratio':>7s}")
print("# ratio = torch time / accord time = accord busbw / torch busbw (same bytes); > 1: accord faster")
summary = []
for op in ops:
    acc = {r["bytes"]: r for r in json.load(open(f"{out}/accord_{op}.json"))["rows"]}
    wrong = sum(r["wrong"] for r in acc.values())
    for t in (r for r in torch["rows"] if r["op"] == op):
        a = acc.get(t["bytes"])
        if not a:
            continue
        bw = a["busbw_gbps"] / t["busbw_gbps"]
        lat = t["time_us"] / a["time_us"]
        summary.append((op, t["bytes"], bw, lat))
        print(f"{op:15s} {t['bytes']:10d} {a['time_us']:10.1f} {t['time_us']:10.1f} "
              f"{a['busbw_gbps']:10.1f} {t['busbw_gbps']:10.1f} {bw:7.3f}")
    if wrong:
        print(f"!! accord {op}: {wrong} wrong elements")
big = [bw for op, b, bw, _ in summary if b >= 1 << 20]
small = [lat for op, b, _, lat in summary if b <= 64 << 10]
if big:
    print(f"# busbw ratio accord/torch from 1 MiB: min {min(big):.3f}, mean {sum(big)/len(big):.3f}")
if small:
    print(f"# latency ratio torch/accord up to 64 KiB: min {min(small):.3f}, mean {sum(small)/len(small):.3f}")
PY
