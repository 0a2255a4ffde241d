#!/usr/bin/env bash
# ForkKV's sweeps in the simulator (issue 36; paper 002 Fig. 3/12, 13, 15): --lora-cache separate vs
# shared at equal KV memory in bytes (as bench/forkkv_sim.sh: shared gives 1/D of the bytes to the
# residual pool) on react-lora and mapreduce-lora, varying one thing at a time from the base point
# (8 workflows, all concurrent, rank 16):
#   workflows   N in WORKFLOW_SET, all concurrent           (number of workflows, Fig. 3/12)
#   concurrency C in CONCURRENCY_SET workflows at once, of 8 (arrival rate: fewer at once = slower arrivals, Fig. 13)
#   rank        R in RANK_SET (a residual token is kv_dim / R times smaller than a base token; Fig. 15)
#   scale       X in SCALE_SET: every prompt part and output length x X (output length, Fig. 15)
# Deterministic (the sim's cost model: prefill 2.5 ms and decode 10 ms a token, one request at a
# time); batch size (Fig. 14c) is not modeled by the replay, so it is not swept here.
# Usage: bench/forkkv_sweep.sh [OUT_DIR]  (env: REACT_TOKENS=10240 MAPREDUCE_TOKENS=12288
#        REACT_SHARE=6 MAPREDUCE_SHARE=4 WORKFLOW_SET="2 4 8 16" CONCURRENCY_SET="1 2 4 8"
#        RANK_SET="8 16 32 64" SCALE_SET="0.5 1 2")
# Writes OUT_DIR/sweep.md: one row per point, separate and shared side by side and their ratio.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/forkkv_sweep}
base_bpt=23040 kv_dim=192 # SmolLM2-135M: 30 layers x 2 x 192 halves a token
mkdir -p "$out"
table=$out/sweep.md
echo "| workload | swept | value | KV memory (MB) | separate hit | shared hit | separate computed | shared computed | separate modeled s | shared modeled s | separate / shared time |" > "$table"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" >> "$table"

# point WORKLOAD SWEPT VALUE WORKFLOWS CONCURRENCY RANK SCALE: one trace, both modes, one row.
point() {
  local wl=$1 swept=$2 value=$3 wf=$4 conc=$5 rank=$6 scale=$7 s d
  if [ "$wl" = react-lora ]; then s=${REACT_TOKENS:-10240} d=${REACT_SHARE:-6}; else s=${MAPREDUCE_TOKENS:-12288} d=${MAPREDUCE_SHARE:-4}; fi
  local trace=$out/$wl.$wf.$conc.$scale.trace
  [ -s "$trace" ] || "$bench" gen --workload "$wl" --workflows "$wf" --concurrency "$conc" --scale "$scale" --model "$model" \
    --trace-tokens --out "$trace" 2> "$trace.err"
  local common=(--trace "$trace" --lora-rank "$rank" --kv-dim "$kv_dim" --kv-bytes-per-token "$base_bpt" --json)
  "$braid" sim "${common[@]}" --kv-tokens "$s" 2> /dev/null | tail -1 > "$out/p.sep.json"
  "$braid" sim "${common[@]}" --kv-tokens $((s * (d - 1) / d)) --lora-cache shared --residual-tokens $((s * kv_dim / rank / d)) \
    2> /dev/null | tail -1 > "$out/p.sh.json"
  python3 - "$out/p.sep.json" "$out/p.sh.json" "$wl" "$swept" "$value" "$s" "$base_bpt" >> "$table" <<'PY'
import json, sys
sep, sh = (json.load(open(p)) for p in sys.argv[1:3])
wl, swept, value, s, bpt = sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
print(f"| {wl} | {swept} | {value} | {s * bpt / 1e6:.1f} | {100 * sep['hit_rate']:.1f}% | {100 * sh['hit_rate']:.1f}% "
      f"| {sep['computed_tokens']} | {sh['computed_tokens']} | {sep['modeled_latency_s']:.1f} | {sh['modeled_latency_s']:.1f} "
      f"| {sep['modeled_latency_s'] / sh['modeled_latency_s']:.2f}x |")
PY
  tail -1 "$table" >&2
}

for wl in react-lora mapreduce-lora; do
  for n in ${WORKFLOW_SET:-2 4 8 16}; do point "$wl" workflows "$n" "$n" "$n" 16 1; done
  for c in ${CONCURRENCY_SET:-1 2 4 8}; do point "$wl" concurrency "$c" 8 "$c" 16 1; done
  for r in ${RANK_SET:-8 16 32 64}; do point "$wl" rank "$r" 8 8 "$r" 1; done
  for x in ${SCALE_SET:-0.5 1 2}; do point "$wl" scale "$x" 8 8 16 "$x"; done
done
rm -f "$out/p.sep.json" "$out/p.sh.json"
cat "$table"
