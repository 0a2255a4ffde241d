#!/usr/bin/env bash
# Segment reuse in the simulator (issue 17): prefill skipped by prefix caching alone and with
# segment reuse (exact; approx at several windows) on traces with token ids of two workloads, at
# a roomy and a tight device cache. Deterministic (no timing): the FLOPs saved are the prefill
# tokens skipped x the model's per-token prefill FLOPs, so the share of tokens is the share of
# linear-layer FLOPs.
# Usage: bench/segment_reuse_sim.sh [OUT_DIR]  (env: WORKFLOWS=32 WINDOWS="0 16 64 256"
#        WORKLOADS="templates codegen" KV_TOKENS="200000 40000" APPEND=1)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/segment_reuse_sim}
workflows=${WORKFLOWS:-32}
windows=${WINDOWS:-0 16 64 256}
workloads=${WORKLOADS:-templates codegen}
kv_list=${KV_TOKENS:-200000 40000}
mkdir -p "$out"
table="$out/table.md"
echo "| workload | device cache (tokens) | mode | W | prompt tokens | prefix-cached | segment-reused | prefill skipped |" > "$table"
echo "|---|---:|---|---:|---:|---:|---:|---:|" >> "$table"
for wl in $workloads; do
  "$bench" gen --workload "$wl" --workflows "$workflows" --concurrency 8 --model "$model" --out "$out/$wl.trace" --trace-tokens \
    2> "$out/$wl.gen.err"
  for kv in $kv_list; do
    for cfg in "off 0" "exact 0" $(for w in $windows; do echo "approx:$w"; done); do
      mode=${cfg%%[ :]*}; w=${cfg##*[ :]}
      "$braid" sim --trace "$out/$wl.trace" --kv-tokens "$kv" --model "$model" --segment-reuse "$mode" --approx-window "$w" --json \
        2> /dev/null | tail -1 > "$out/$wl.$kv.$mode.$w.json"
      python3 - "$out/$wl.$kv.$mode.$w.json" "$wl" "$kv" "$mode" "$w" >> "$table" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); p = r["prompt_tokens"]; c = r["cached_tokens"]; s = r["segment_reused_tokens"]
w = sys.argv[5] if sys.argv[4] == "approx" else ""
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {w} | {p} | {100 * c / p:.1f}% | {100 * s / p:.1f}% | {100 * (c + s) / p:.1f}% |")
PY
    done
  done
done
cat "$table"
if [ "${APPEND:-1}" = 1 ]; then
  {
    echo
    echo "### Segment reuse in braid sim ($(date -u +%Y-%m-%d))"
    echo
    echo "Command: \`WORKFLOWS=$workflows KV_TOKENS=\"$kv_list\" bench/segment_reuse_sim.sh\` (deterministic; no timing)"
    echo
    cat "$table"
  } >> "$root/bench/RESULTS.md"
fi
