#!/usr/bin/env bash
# PBKV live on the CPU cluster: the same braid-bench run under --policy lru, kvflow and pbkv
# (device tier only, so the policies alone decide), hit rate from /metrics, mean workflow latency
# from the driver, and each run's trace replayed by the simulator under the same policy.
# MODE=prefetch instead runs --policy pbkv with a host tier of LIVE_HOST_KV_BLOCKS, --prefetch off
# then on, back to back on the same driver arguments: hit rate by tier, latency, and the prefetch
# counters (prefetched / used / wasted blocks) from /metrics.
#   bench/pbkv_live.sh [OUT_DIR]
# Environment: MODE (policies | prefetch), WORKLOADS (codegen factcheck), POLICIES (lru kvflow
# pbkv), LIVE_WORKFLOWS / LIVE_CONCURRENCY / LIVE_SCALE / LIVE_KV_BLOCKS / LIVE_MAX_TOKENS (12 / 4 /
# 0.25 / 256 / 32), LIVE_HOST_KV_BLOCKS (prefetch mode: 4 x LIVE_KV_BLOCKS), PREFETCH_ARMS
# (prefetch mode: "off on"; e.g. "off on off" to bracket a drifting machine), PREDICTOR_DIR (a
# directory with WORKLOAD.graph.bin or WORKLOAD.markov2.bin from braid train-predictor,
# PREDICTOR_KIND graph|markov2: the coordinator forecasts with it instead of an online Markov-1).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/braid-pbkv-live}
mkdir -p "$out"
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
workloads=${WORKLOADS:-"codegen factcheck"} policies=${POLICIES:-"lru kvflow pbkv"}
wf=${LIVE_WORKFLOWS:-12} conc=${LIVE_CONCURRENCY:-4} scale=${LIVE_SCALE:-0.25} blocks=${LIVE_KV_BLOCKS:-256}
cap=${LIVE_MAX_TOKENS:-32} port=${PORT:-18051} mode=${MODE:-policies}
kv_tokens=$(( (blocks - 1) * 16 ))
driver_args="--workflows $wf --concurrency $conc --seed 1 --scale $scale --max-tokens-cap $cap"
echo "# bench/pbkv_live.sh $out — $(date -u +%F), $(nproc) cores"
. bench/live_run.sh

predictor_args() {  # predictor_args WORKLOAD -> the --predictor option, when PREDICTOR_DIR is set
  [ -n "${PREDICTOR_DIR:-}" ] && echo "--predictor $PREDICTOR_DIR/$1.${PREDICTOR_KIND:-graph}.bin"
  return 0
}

if [ "$mode" = prefetch ]; then
  declare -A seen  # a repeated arm gets its own directory
  host=${LIVE_HOST_KV_BLOCKS:-$(( 4 * blocks ))}
  echo "cluster: launch/braid-local --instances 1 --kv-blocks $blocks --host-kv-blocks $host --policy pbkv --prefetch off|on;"
  echo "driver: braid-bench run $driver_args"
  echo
  echo "| workload | prefetch | hit rate (device + host) | device | host | mean workflow latency | p90 workflow latency | mean TTFT | prefetched blocks | used | wasted | forecasts step-1 right | wall |"
  echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for w in $workloads; do
    for pf in ${PREFETCH_ARMS:-off on}; do
      dir=$out/$w-prefetch-$pf
      n=2
      while [ -n "${seen[$dir]:-}" ]; do dir=$out/$w-prefetch-$pf.$n; n=$((n + 1)); done
      seen[$dir]=1
      start=$(date +%s)
      # shellcheck disable=SC2046 # predictor_args is an option list on purpose
      live_run "$dir" "$dir" "$w" "$driver_args" --kv-blocks "$blocks" --host-kv-blocks "$host" --policy pbkv --prefetch "$pf" \
        $(predictor_args "$w")
      wall=$(( $(date +%s) - start ))
      m=$dir/metrics.txt
      dev=$(metric 'braid_prompt_tokens_cached_total{tier="device"}' "$m") hst=$(metric 'braid_prompt_tokens_cached_total{tier="host"}' "$m")
      comp=$(metric braid_prompt_tokens_computed_total "$m")
      pfb=$(metric braid_kv_prefetched_blocks_total "$m") pfh=$(metric braid_kv_prefetch_hit_blocks_total "$m")
      pfw=$(metric braid_kv_prefetch_wasted_blocks_total "$m")
      ok=$(metric braid_workflow_forecast_step1_correct_total "$m") all=$(metric braid_workflow_forecast_step1_total "$m")
      python3 - "$dir/summary.json" "$w" "$pf" "$dev" "$hst" "$comp" "$pfb" "$pfh" "$pfw" "$ok" "$all" "$wall" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
w, pf, dev, hst, comp, pfb, pfh, pfw, ok, n, wall = sys.argv[2:]
dev, hst, comp = float(dev), float(hst), float(comp)
tot = (dev + hst + comp) or 1
print("| %s | %s | %.1f%% | %.1f%% | %.1f%% | %.1f s | %.1f s | %.0f ms | %s | %s | %s | %s / %s | %s s |" % (
    w, pf, 100 * (dev + hst) / tot, 100 * dev / tot, 100 * hst / tot, s["mean_workflow_latency_s"],
    s["p90_workflow_latency_s"], s["mean_ttft_ms"], pfb, pfh, pfw, ok, n, wall))
PY
    done
  done
  exit 0
fi

echo "cluster: launch/braid-local --instances 1 --kv-blocks $blocks --host-kv-blocks 0 --policy P;"
echo "driver: braid-bench run $driver_args"
echo
echo "| workload | policy | live hit rate | sim, same trace and policy | mean workflow latency (live) | forecasts step-1 right |"
echo "| --- | --- | ---: | ---: | ---: | ---: |"
for w in $workloads; do
  for p in $policies; do
    dir=$out/$w-$p
    read -r -a pred <<< "$(predictor_args "$w")"
    live_run "$dir" "$out/$w-$p" "$w" "$driver_args" \
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
