#!/usr/bin/env bash
# PBKV live, lru and pbkv side by side: two one-instance clusters started at the same moment on the
# same machine (so a drifting load hits both arms alike), the same braid-bench driver arguments
# against each, device tier only. Every SNAP_S seconds both arms' /metrics are read at the same
# moment (hit rate so far, requests, load average) into OUT/snaps.log; at the end, each arm's live
# hit rate and the ratio, then each arm's own trace replayed by braid sim at the same device budget
# under lru, pbkv and belady (belady: the bound any policy has on that trace).
#   bench/pbkv_live_pair.sh OUT_DIR
# Environment: WORKLOAD (factcheck), LIVE_WORKFLOWS / LIVE_CONCURRENCY / LIVE_SCALE / LIVE_KV_BLOCKS /
# LIVE_MAX_TOKENS (12 / 6 / 0.125 / 200 / 32), MAX_RUNNING (4), THREADS (1 per cluster), PREDICTOR
# (a braid train-predictor file; required: the coordinator forecasts with it for both arms),
# PORT_BASE (18261: lru on it, pbkv on the next), SNAP_S (120), BRAID_BIN / BENCH_BIN (frozen copies
# of build/braid and build/braid-bench, so the tree can be rebuilt during a run), SIM_BIN (BRAID_BIN),
# STOP_AFTER_S (0 = none: otherwise both drivers get SIGINT at the same moment after that many seconds,
# each cluster's /metrics is still read, and the sim replays the requests each arm finished; the
# driver then writes no requests.jsonl / summary.json, so latency reads "?").
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/braid-pbkv-live-pair}
mkdir -p "$out"
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
w=${WORKLOAD:-factcheck} wf=${LIVE_WORKFLOWS:-12} conc=${LIVE_CONCURRENCY:-6} scale=${LIVE_SCALE:-0.125}
blocks=${LIVE_KV_BLOCKS:-200} cap=${LIVE_MAX_TOKENS:-32} running=${MAX_RUNNING:-4} threads=${THREADS:-1}
base=${PORT_BASE:-18261} snap_s=${SNAP_S:-120}
predictor=${PREDICTOR:?set PREDICTOR to a braid train-predictor file for $w}
export BRAID_BIN=${BRAID_BIN:-build/braid} BENCH_BIN=${BENCH_BIN:-build/braid-bench}
sim=${SIM_BIN:-$BRAID_BIN}
kv_tokens=$(( (blocks - 1) * 16 )) # the pool less the scratch block, as pbkv_live.sh
driver_args="--workflows $wf --concurrency $conc --seed 1 --scale $scale --max-tokens-cap $cap"
. bench/live_run.sh

hit_of() { # hit_of METRICS_FILE -> "hit% requests" (device-cached / (cached + computed) prompt tokens)
  awk '$1 == "braid_prompt_tokens_cached_total{tier=\"device\"}" {d += $2} $1 == "braid_prompt_tokens_computed_total" {c += $2}
       $1 ~ /^braid_requests_total/ {r += $2} END {printf "%.1f%% %d\n", (d + c) ? 100 * d / (d + c) : 0, r}' "$1"
}

snapshots() { # every snap_s seconds, both arms at the same moment
  while true; do
    sleep "$snap_s"
    local row
    row="$(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    for i in 0 1; do
      curl -s -m 20 "http://127.0.0.1:$((base + i))/metrics" > "$out/snap.$i.txt" 2> /dev/null || { row="$row | arm $i down"; continue; }
      row="$row | $( [ $i = 0 ] && echo lru || echo pbkv ) $(hit_of "$out/snap.$i.txt")"
    done
    echo "$row" >> "$out/snaps.log"
  done
}

echo "# bench/pbkv_live_pair.sh $out — $(date -u +%F), $(nproc) cores"
echo "clusters (both at once): launch/braid-local --instances 1 --kv-blocks $blocks --host-kv-blocks 0 --policy lru|pbkv --predictor $(basename "$predictor") --threads $threads --max-running $running"
echo "driver (each): braid-bench run --workload $w $driver_args"
echo "start $(date -u +%T) $(uptime)" | tee "$out/times"
: > "$out/snaps.log"
snapshots &
snap_pid=$!
arm_pids=()
trap 'kill "$snap_pid" "${arm_pids[@]}" 2> /dev/null' EXIT
i=0
for p in lru pbkv; do
  # shellcheck disable=SC2086 # the serve arguments are a word list on purpose
  (port=$((base + i)); live_run "$out/$w-$p" "$out/$w-$p" "$w" "$driver_args" --kv-blocks "$blocks" --host-kv-blocks 0 --policy "$p" \
     --predictor "$predictor" --threads "$threads" --max-running "$running") &
  arm_pids+=($!)
  i=$((i + 1))
done
stop_drivers() { # SIGINT to both arms' braid-bench run at once (live_run then reads /metrics and stops the cluster)
  local pids=()
  for pid in "${arm_pids[@]}"; do pids+=($(pgrep -P "$pid" -f -- "run --workload $w ")); done # this run's drivers only
  [ ${#pids[@]} -gt 0 ] && kill -INT "${pids[@]}" 2> /dev/null
  echo "stopped $(date -u +%T) after ${STOP_AFTER_S} s: $(uptime)" | tee -a "$out/times"
}
if [ "${STOP_AFTER_S:-0}" -gt 0 ]; then
  (sleep "$STOP_AFTER_S"; stop_drivers) &
  stopper_pid=$!
fi
for pid in "${arm_pids[@]}"; do wait "$pid"; done
[ -n "${stopper_pid:-}" ] && kill "$stopper_pid" 2> /dev/null
kill "$snap_pid" 2> /dev/null
echo "end $(date -u +%T) $(uptime)" | tee -a "$out/times"
echo
echo "| arm | requests | live hit rate | mean workflow latency | forecasts step-1 right |"
echo "| --- | ---: | ---: | ---: | ---: |"
for p in lru pbkv; do
  m=$out/$w-$p/metrics.txt
  read -r hit reqs <<< "$(hit_of "$m")"
  lat=$(python3 -c "import json; print('%.1f s' % json.load(open('$out/$w-$p/summary.json'))['mean_workflow_latency_s'])" 2> /dev/null || echo "?")
  echo "| $p | $reqs | $hit | $lat | $(metric braid_workflow_forecast_step1_correct_total "$m") / $(metric braid_workflow_forecast_step1_total "$m") |"
done
echo
echo "Each arm's trace in braid sim --kv-tokens $kv_tokens --cache-outputs:"
echo
echo "| trace | requests | lru | pbkv | belady | pbkv / lru | belady / lru |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
for p in lru pbkv; do
  t=$out/$w-$p/trace.complete.jsonl # whole JSON lines only (a stopped driver may leave a partial last line)
  python3 -c "
import json, sys
for line in open(sys.argv[1]):
    try: json.loads(line)
    except ValueError: continue
    sys.stdout.write(line)" "$out/$w-$p/trace.jsonl" > "$t" 2> /dev/null
  [ -s "$t" ] || { echo "| $p arm | no trace | | | | | |"; continue; }
  declare -A h=()
  for q in lru pbkv belady; do
    args=(--trace "$t" --kv-tokens "$kv_tokens" --cache-outputs --policy "$q" --json)
    [ "$q" = pbkv ] && args+=(--predictor "$predictor")
    h[$q]=$("$sim" sim "${args[@]}" 2> /dev/null | tail -1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["hit_rate"])')
  done
  python3 -c "
l, p, b = ${h[lru]:-0}, ${h[pbkv]:-0}, ${h[belady]:-0}
print('| $p arm | $(grep -c '"request"' "$t") | %.1f%% | %.1f%% | %.1f%% | %.2fx | %.2fx |' % (100 * l, 100 * p, 100 * b, p / l if l else 0, b / l if l else 0))"
done
