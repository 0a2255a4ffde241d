#!/usr/bin/env bash
# The baseline scoreboard of the workload issue: for codegen, factcheck and pipeline,
#   1. pressure sweep from the simulator: LRU and Belady token-level hit rates as the KV budget
#      shrinks, on a dry trace (braid-bench gen, no model run);
#   2. one live run per workload on the CPU cluster (braid-bench run) at a pool size where LRU
#      evicts steadily, and the simulator replaying that run's own trace at the same budget, so
#      live and simulated hit rates can be compared on the same requests.
#   bench/baseline_study.sh [OUT_DIR]
# Environment: WORKFLOWS / CONCURRENCY / SCALE for the dry traces (default 200 / 16 / 1.0),
# LIVE_WORKFLOWS / LIVE_CONCURRENCY / LIVE_SCALE / LIVE_KV_BLOCKS for the live runs
# (default 12 / 4 / 0.25 / 320) and LIVE_MAX_TOKENS (output cap per call, default 32), BUDGETS (tokens, default "262144 131072 65536 32768 16384 8192"),
# LIVE=0 to skip the live runs.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/braid-baseline}
mkdir -p "$out"
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
workloads=${WORKLOADS:-"codegen factcheck pipeline"}
budgets=${BUDGETS:-"262144 131072 65536 32768 16384 8192"}
wf=${WORKFLOWS:-200} conc=${CONCURRENCY:-16} scale=${SCALE:-1.0}
live_wf=${LIVE_WORKFLOWS:-12} live_conc=${LIVE_CONCURRENCY:-4} live_scale=${LIVE_SCALE:-0.25}
live_blocks=${LIVE_KV_BLOCKS:-320} live_cap=${LIVE_MAX_TOKENS:-32} port=${PORT:-18031}

echo "# bench/baseline_study.sh $out — $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "dry traces: braid-bench gen --workflows $wf --concurrency $conc --seed 1 --scale $scale"

sim_field() {  # sim_field TRACE KV POLICY FIELD [extra sim args]
  local trace=$1 kv=$2 policy=$3 field=$4; shift 4
  build/braid sim --trace "$trace" --kv-tokens "$kv" --policy "$policy" --json "$@" 2> /dev/null | tail -1 |
    python3 -c "import json, sys; print(json.load(sys.stdin)['$field'])"
}
pct() { python3 -c "print(f'{100 * float(\"$1\"):.1f}%')"; }

echo
echo "## 1. Pressure sweep (simulator): token-level hit rate, LRU / Belady"
echo
printf "| workload | requests | prompt tokens |"; for b in $budgets; do printf " %s tokens |" "$b"; done; echo
printf "| --- | ---: | ---: |"; for b in $budgets; do printf " ---: |"; done; echo
for w in $workloads; do
  trace=$out/$w.dry.jsonl
  build/braid-bench gen --workload "$w" --workflows "$wf" --concurrency "$conc" --seed 1 --scale "$scale" \
    --model "$model" --out "$trace" 2> "$out/$w.gen.log"
  reqs=$(sim_field "$trace" 1000000000 lru requests)
  toks=$(sim_field "$trace" 1000000000 lru prompt_tokens)
  printf "| %s | %s | %s |" "$w" "$reqs" "$toks"
  for b in $budgets; do
    printf " %s / %s |" "$(pct "$(sim_field "$trace" "$b" lru hit_rate)")" "$(pct "$(sim_field "$trace" "$b" belady hit_rate)")"
  done
  echo
done

[ "${LIVE:-1}" = 1 ] || exit 0
echo
echo "## 2. Live runs vs the simulator on the same trace"
echo "cluster: launch/braid-local --instances 1 --kv-blocks $live_blocks; driver: braid-bench run --workflows $live_wf --concurrency $live_conc --seed 1 --scale $live_scale --max-tokens-cap $live_cap"
echo
echo "| workload | requests | live hit rate | sim LRU, same trace | sim Belady, same trace | live evictions | sim LRU evictions | mean workflow latency (live) |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
kv_tokens=$(( (live_blocks - 1) * 16 ))   # block 0 is the null block
for w in $workloads; do
  dir=$out/live-$w
  rm -rf "$dir"
  launch/braid-local --model "$model" --instances 1 --kv-blocks "$live_blocks" --port "$port" > "$out/$w.serve.log" 2>&1 &
  launcher=$!
  for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.5; done
  build/braid-bench run --workload "$w" --url "http://127.0.0.1:$port" --workflows "$live_wf" --concurrency "$live_conc" \
    --seed 1 --scale "$live_scale" --max-tokens-cap "$live_cap" --model "$model" --out "$dir" > "$out/$w.run.log" 2>&1
  evictions=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^braid_instance_evicted_blocks_total/ {s += $2} END {print s + 0}')
  kill -TERM "$launcher"; wait "$launcher" || true
  live=$(python3 -c "import json; print(json.load(open('$dir/summary.json'))['hit_rate'])")
  lat=$(python3 -c "import json; print(f\"{json.load(open('$dir/summary.json'))['mean_workflow_latency_s']:.1f} s\")")
  printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n" "$w" "$(sim_field "$dir/trace.jsonl" "$kv_tokens" lru requests)" \
    "$(pct "$live")" "$(pct "$(sim_field "$dir/trace.jsonl" "$kv_tokens" lru hit_rate)")" \
    "$(pct "$(sim_field "$dir/trace.jsonl" "$kv_tokens" belady hit_rate)")" "$evictions" \
    "$(sim_field "$dir/trace.jsonl" "$kv_tokens" lru evictions)" "$lat"
done
