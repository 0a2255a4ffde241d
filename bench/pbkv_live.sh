#!/usr/bin/env bash
# PBKV live on the CPU cluster: the same braid-bench run under --policy lru, kvflow and pbkv
# (device tier only, so the policies alone decide), hit rate from /metrics, mean workflow latency
# from the driver, and each run's trace replayed by the simulator under the same policy.
#   bench/pbkv_live.sh [OUT_DIR]
# Environment: WORKLOADS (codegen factcheck), POLICIES (lru kvflow pbkv), LIVE_WORKFLOWS /
# LIVE_CONCURRENCY / LIVE_SCALE / LIVE_KV_BLOCKS / LIVE_MAX_TOKENS (12 / 4 / 0.25 / 256 / 32),
# PREDICTOR_DIR (a directory with WORKLOAD.graph.bin or WORKLOAD.markov2.bin from braid
# train-predictor, PREDICTOR_KIND graph|markov2: the coordinator forecasts with it instead of an
# online Markov-1).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/braid-pbkv-live}
mkdir -p "$out"
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
workloads=${WORKLOADS:-"codegen factcheck"} policies=${POLICIES:-"lru kvflow pbkv"}
wf=${LIVE_WORKFLOWS:-12} conc=${LIVE_CONCURRENCY:-4} scale=${LIVE_SCALE:-0.25} blocks=${LIVE_KV_BLOCKS:-256}
cap=${LIVE_MAX_TOKENS:-32} port=${PORT:-18051}
kv_tokens=$(( (blocks - 1) * 16 ))
echo "# bench/pbkv_live.sh $out — $(date -u +%F), $(nproc) cores"
echo "cluster: launch/braid-local --instances 1 --kv-blocks $blocks --host-kv-blocks 0 --policy P;"
echo "driver: braid-bench run --workflows $wf --concurrency $conc --seed 1 --scale $scale --max-tokens-cap $cap"
echo
echo "| workload | policy | live hit rate | sim, same trace and policy | mean workflow latency (live) | forecasts step-1 right |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
. bench/live_run.sh
for w in $workloads; do
  for p in $policies; do
    dir=$out/$w-$p
    pred=()
    [ -n "${PREDICTOR_DIR:-}" ] && pred=(--predictor "$PREDICTOR_DIR/$w.${PREDICTOR_KIND:-graph}.bin")
    live_run "$dir" "$out/$w-$p" "$w" "--workflows $wf --concurrency $conc --seed 1 --scale $scale --max-tokens-cap $cap" \
      --kv-blocks "$blocks" --host-kv-blocks 0 --policy "$p" "${pred[@]+"${pred[@]}"}"
    m=$dir/metrics.txt
    dev=$(metric 'braid_prompt_tokens_cached_total{tier="device"}' "$m") comp=$(metric braid_prompt_tokens_computed_total "$m")
    ok=$(metric braid_workflow_forecast_step1_correct_total "$m") all=$(metric braid_workflow_forecast_step1_total "$m")
    sim=$(build/braid sim --trace "$dir/trace.jsonl" --kv-tokens "$kv_tokens" --policy "$p" "${pred[@]+"${pred[@]}"}" --json 2> /dev/null | tail -1 |
      python3 -c 'import json, sys; print("%.1f%%" % (100 * json.load(sys.stdin)["hit_rate"]))')
    lat=$(python3 -c "import json; print('%.1f s' % json.load(open('$dir/summary.json'))['mean_workflow_latency_s'])")
    echo "| $w | $p | $(python3 -c "print('%.1f%%' % (100 * $dev / (($dev + $comp) or 1)))") | $sim | $lat | $ok / $all |"
  done
done
