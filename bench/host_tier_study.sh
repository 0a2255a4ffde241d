#!/usr/bin/env bash
# The host-tier study of the cache-core issue: does a host-memory tier under the device KV pool
# turn LRU's evictions into load-backs, and does the simulator model it?
#   1. simulator, dry traces (braid-bench gen): codegen and factcheck at the device budget where
#      LRU alone keeps ~30% (65 536 tokens), device only vs device + a host tier 4x its size:
#      hit rate split by tier, modeled mean workflow latency, load-back traffic;
#   2. live on the CPU cluster (braid-bench run), host tier off and on (4x the pool), each run's
#      own trace replayed by the simulator at the same sizes: live and simulated hit rates per
#      tier, and whether the two live runs produced the same requests (greedy outputs feed the
#      next agents' prompts, so equal traces mean equal outputs).
#   bench/host_tier_study.sh [OUT_DIR]
# Environment: WORKFLOWS / CONCURRENCY / SCALE / DEVICE_TOKENS for part 1 (200 / 16 / 1.0 / 65536),
# LIVE_WORKFLOWS / LIVE_CONCURRENCY / LIVE_SCALE / LIVE_KV_BLOCKS / LIVE_MAX_TOKENS for part 2
# (12 / 4 / 0.25 / 256 / 32), LIVE=0 to skip part 2.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/braid-host-tier}
mkdir -p "$out"
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
workloads=${WORKLOADS:-"codegen factcheck"}
wf=${WORKFLOWS:-200} conc=${CONCURRENCY:-16} scale=${SCALE:-1.0} dev_tokens=${DEVICE_TOKENS:-65536}
live_wf=${LIVE_WORKFLOWS:-12} live_conc=${LIVE_CONCURRENCY:-4} live_scale=${LIVE_SCALE:-0.25}
live_blocks=${LIVE_KV_BLOCKS:-256} live_cap=${LIVE_MAX_TOKENS:-32} port=${PORT:-18041}

echo "# bench/host_tier_study.sh $out — $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

sim_json() {  # sim_json TRACE DEVICE_TOKENS HOST_TOKENS -> the JSON summary line
  build/braid sim --trace "$1" --kv-tokens "$2" --host-kv-tokens "$3" --policy lru --json 2> /dev/null | tail -1
}
# sim_row JSON -> "hit rate | device hits | host hits | latency | loaded (traffic, copy time) | demoted"
sim_row() {
  python3 -c '
import json, sys
r = json.loads(sys.argv[1]); p = r["prompt_tokens"] or 1
gb = r["loaded_blocks"] * 16 * 23040 / 1e9
print("%.1f%% | %.1f%% | %.1f%% | %.1f s | %d (%.2f GB, %.2f s) | %d" % (100 * r["hit_rate"], 100 * r["device_cached_tokens"] / p,
      100 * r["host_cached_tokens"] / p, r["mean_workflow_latency_s"], r["loaded_blocks"], gb, r["copy_s"], r["demoted_blocks"]))' "$1"
}

echo
echo "## 1. Simulator, dry traces: device $dev_tokens tokens, host tier off vs $((4 * dev_tokens)) tokens (LRU)"
echo "traces: braid-bench gen --workflows $wf --concurrency $conc --seed 1 --scale $scale"
echo
echo "| workload | host tier | hit rate | device hits | host hits | mean workflow latency (modeled) | blocks loaded back (traffic, copy time) | blocks demoted |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for w in $workloads; do
  trace=$out/$w.dry.jsonl
  [ -s "$trace" ] || build/braid-bench gen --workload "$w" --workflows "$wf" --concurrency "$conc" --seed 1 --scale "$scale" \
    --model "$model" --out "$trace" 2> "$out/$w.gen.log"
  for host in 0 $((4 * dev_tokens)); do
    echo "| $w | $([ "$host" = 0 ] && echo off || echo "$host tokens") | $(sim_row "$(sim_json "$trace" "$dev_tokens" "$host")") |"
  done
done

[ "${LIVE:-1}" = 1 ] || exit 0
echo
host_blocks=$((4 * (live_blocks - 1)))
kv_tokens=$(( (live_blocks - 1) * 16 )) host_tokens=$((host_blocks * 16))
echo "## 2. Live (CPU cluster) vs the simulator on each run's own trace"
echo "cluster: launch/braid-local --instances 1 --kv-blocks $live_blocks --host-kv-blocks 0 | $host_blocks;"
echo "driver: braid-bench run --workflows $live_wf --concurrency $live_conc --seed 1 --scale $live_scale --max-tokens-cap $live_cap"
echo
echo "| workload | host tier | requests | live hit rate (device + host) | sim, same trace (device + host) | live demoted / loaded blocks | mean workflow latency (live) |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
. bench/live_run.sh
for w in $workloads; do
  for host in 0 "$host_blocks"; do
    dir=$out/live-$w-host$host
    live_run "$dir" "$out/$w.host$host" "$w" \
      "--workflows $live_wf --concurrency $live_conc --seed 1 --scale $live_scale --max-tokens-cap $live_cap" \
      --kv-blocks "$live_blocks" --host-kv-blocks "$host"
    m=$dir/metrics.txt
    dev=$(metric 'braid_prompt_tokens_cached_total{tier="device"}' "$m")
    hst=$(metric 'braid_prompt_tokens_cached_total{tier="host"}' "$m")
    total=$(( $(metric braid_prompt_tokens_computed_total "$m") + dev + hst ))
    live=$(python3 -c "t = $total or 1; print(f'{100*($dev+$hst)/t:.1f}% ({100*$dev/t:.1f} + {100*$hst/t:.1f})')")
    sim=$(python3 -c '
import json, sys
r = json.loads(sys.argv[1]); p = r["prompt_tokens"] or 1
print("%.1f%% (%.1f + %.1f)" % (100 * r["hit_rate"], 100 * r["device_cached_tokens"] / p, 100 * r["host_cached_tokens"] / p))' \
      "$(sim_json "$dir/trace.jsonl" "$kv_tokens" "$([ "$host" = 0 ] && echo 0 || echo "$host_tokens")")")
    lat=$(python3 -c "import json; print(f\"{json.load(open('$dir/summary.json'))['mean_workflow_latency_s']:.1f} s\")")
    reqs=$(python3 -c "import json, sys; print(sum(json.loads(l).get('type') == 'request' for l in open(sys.argv[1])))" "$dir/trace.jsonl")
    echo "| $w | $([ "$host" = 0 ] && echo off || echo "$host blocks") | $reqs | $live | $sim | $(metric braid_kv_demoted_blocks_total "$m") / $(metric braid_kv_loaded_blocks_total "$m") | $lat |"
  done
  # Same requests in both runs? Compare each trace's requests as (workflow, agent, block hashes,
  # output tokens), order-free: arrival order moves with timing, content only with outputs.
  same=$(python3 - "$out/live-$w-host0/trace.jsonl" "$out/live-$w-host$host_blocks/trace.jsonl" <<'PY'
import json, sys
def canon(path):
    rows = []
    for line in open(path):
        r = json.loads(line)
        if r.get("type") != "request": continue
        rows.append((r.get("workflow", ""), r.get("agent", ""), tuple(r.get("blocks", [])), r.get("output_tokens")))
    return sorted(rows)
a, b = canon(sys.argv[1]), canon(sys.argv[2])
print(f"{'identical' if a == b else 'DIFFERENT'} ({len(a)} vs {len(b)} requests)")
PY
)
  echo "| $w | requests with host tier off vs on | $same | | | | |"
done
