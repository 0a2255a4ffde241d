#!/usr/bin/env bash
# The PBKV scoreboard in the simulator: token hit rate of lru / kvflow / pbkv / belady on dry
# traces of the dynamic loops (codegen, factcheck) and the static pipeline, at several device
# budgets, with the share of the LRU -> Belady gap pbkv closes; pbkv with a predictor trained on
# other traces (braid train-predictor) next to one learning online; next-agent accuracy at K = 1..4.
# Two more parts run on the issue's sweep traces (400 workflows, concurrency 72, seed 21, as
# bench/workload_sweep.sh): "plot", the hit rate over time of lru / kvflow / pbkv / belady on one
# figure (braid sim --timeline, braid-bench plot; needs gnuplot), and "prefetch", pbkv with a host
# tier with and without --prefetch: hit rate, modeled latency and the prefetched blocks used and
# wasted (evicted unused). "noise" is the paper's App. E on the same traces: the forecasts of a
# graph predictor (trained on seed 2) perturbed as (1 - lambda) P + lambda U (braid sim
# --prediction-noise), pbkv device only, with a host tier, and with a host tier and --prefetch.
#   bench/pbkv_study.sh [OUT_DIR]
# Environment: PARTS (default "scoreboard plot prefetch"); scoreboard: WORKFLOWS / CONCURRENCY
# (200 / 16), EVAL_SEED (1; training is seed 2), BUDGETS (tokens, default "32768 65536 131072"),
# WORKLOADS (default "codegen factcheck
# pipeline"); plot: PLOT_WORKLOAD / PLOT_KV (codegen / 140000, where LRU hits ~30%), PLOT_PREDICTOR
# (a braid train-predictor file for kvflow and pbkv; default: online Markov-1), PLOT_OUT
# (bench/plots/pbkv_hit_rate_over_time.png); prefetch: PREFETCH_WORKLOADS (codegen factcheck),
# PREFETCH_BUDGETS (device tokens, "40000 140000"), HOST_FACTOR (host tier = 4x the device); noise
# (not in the default PARTS): NOISE_WORKLOADS (factcheck codegen), NOISE_KV (80000, where LRU hits
# 26-27%), NOISE_LEVELS ("0 0.1 0.2 0.3 0.4 0.6 1"), HOST_FACTOR.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/braid-pbkv}
mkdir -p "$out"
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
workloads=${WORKLOADS:-"codegen factcheck pipeline"}
budgets=${BUDGETS:-"32768 65536 131072"}
wf=${WORKFLOWS:-200} conc=${CONCURRENCY:-16} eval_seed=${EVAL_SEED:-1}
parts=${PARTS:-"scoreboard plot prefetch"}
has_part() { [[ " $parts " == *" $1 "* ]]; }

echo "# bench/pbkv_study.sh $out — $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"

# The issue's sweep trace of workload $1 (400 workflows, concurrency 72, seed 21).
sweep_trace() {
  local t=$out/sweep.$1.jsonl
  [ -s "$t" ] || build/braid-bench gen --workload "$1" --workflows 400 --concurrency 72 --seed 21 --model "$model" --out "$t" 2> /dev/null
  echo "$t"
}

if has_part scoreboard; then
echo "traces: braid-bench gen --workflows $wf --concurrency $conc --seed $eval_seed (evaluated) and --seed 2 (predictor training)"

hit() {  # hit TRACE KV POLICY [args] -> "hit_rate latency"
  local trace=$1 kv=$2 policy=$3; shift 3
  build/braid sim --trace "$trace" --kv-tokens "$kv" --policy "$policy" --json "$@" 2> /dev/null | tail -1 |
    python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["hit_rate"], r["mean_workflow_latency_s"])'
}

for w in $workloads; do
  for seed in "$eval_seed" 2; do
    t=$out/$w.s$seed.jsonl
    [ -s "$t" ] || build/braid-bench gen --workload "$w" --workflows "$wf" --concurrency "$conc" --seed "$seed" \
      --model "$model" --out "$t" 2> /dev/null
  done
  for k in markov1 markov2 graph; do
    build/braid train-predictor --traces "$out/$w.s2.jsonl" --out "$out/$w.$k.bin" --kind $k \
      --eval "$out/$w.s$eval_seed.jsonl" > /dev/null 2> "$out/$w.$k.train.log"
  done
done

echo
echo "## Token hit rate (modeled mean workflow latency) per policy"
echo
echo "kvflow and the last pbkv column take forecasts from the trained graph predictor; the ratios are of that pbkv column."
echo
echo "| workload | budget | lru | kvflow | pbkv (online Markov-1) | pbkv (trained Markov-2) | pbkv (trained graph) | belady | gap closed by pbkv | pbkv / lru | pbkv / kvflow |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for w in $workloads; do
  t=$out/$w.s$eval_seed.jsonl
  for b in $budgets; do
    read -r lru lru_l <<< "$(hit "$t" "$b" lru)"
    read -r kvf kvf_l <<< "$(hit "$t" "$b" kvflow --predictor "$out/$w.graph.bin")"
    read -r pb pb_l <<< "$(hit "$t" "$b" pbkv)"
    read -r pbt pbt_l <<< "$(hit "$t" "$b" pbkv --predictor "$out/$w.markov2.bin")"
    read -r pbg pbg_l <<< "$(hit "$t" "$b" pbkv --predictor "$out/$w.graph.bin")"
    read -r bel bel_l <<< "$(hit "$t" "$b" belady)"
    python3 - "$w" "$b" "$lru" "$lru_l" "$kvf" "$kvf_l" "$pb" "$pb_l" "$pbt" "$pbt_l" "$pbg" "$pbg_l" "$bel" "$bel_l" <<'PY'
import sys
w, b = sys.argv[1], sys.argv[2]
v = list(map(float, sys.argv[3:]))
lru, kvf, pbg, bel = v[0], v[2], v[8], v[10]
cell = lambda h, l: "%.1f%% (%.1f s)" % (100 * h, l)
gap = "%.0f%%" % (100 * (pbg - lru) / (bel - lru)) if bel - lru > 1e-4 else "n/a"
print("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.2fx | %.2fx |" % (w, b, cell(v[0], v[1]), cell(v[2], v[3]), cell(v[4], v[5]),
      cell(v[6], v[7]), cell(v[8], v[9]), cell(v[10], v[11]), gap, pbg / lru if lru else 0, pbg / kvf if kvf else 0))
PY
  done
done

echo
echo "## Next-agent accuracy (top-1 per step; trained on seed 2, evaluated on seed $eval_seed)"
echo
for w in $workloads; do
  for k in markov1 markov2 graph; do
    echo "$w $k: $(grep -i 'held-out\|eval' "$out/$w.$k.train.log" | tail -1)"
  done
done
fi

if has_part plot; then
  pw=${PLOT_WORKLOAD:-codegen} pkv=${PLOT_KV:-140000} pout=${PLOT_OUT:-bench/plots/pbkv_hit_rate_over_time.png}
  t=$(sweep_trace "$pw")
  echo
  echo "## Hit rate over time: $pw, $pkv-token device cache (braid sim --timeline; braid-bench plot -> $pout)"
  echo
  echo "| policy | hit rate | mean workflow latency (modeled) |"
  echo "| --- | ---: | ---: |"
  inputs=()
  pred=()
  [ -n "${PLOT_PREDICTOR:-}" ] && pred=(--predictor "$PLOT_PREDICTOR")
  for p in lru kvflow pbkv belady; do
    build/braid sim --trace "$t" --kv-tokens "$pkv" --policy "$p" "${pred[@]+"${pred[@]}"}" --json --timeline "$out/timeline.$pw.$p.jsonl" 2> /dev/null | tail -1 |
      python3 -c 'import json, sys; r = json.load(sys.stdin); print("| %s | %.1f%% | %.1f s |" % (r["policy"], 100 * r["hit_rate"], r["mean_workflow_latency_s"]))'
    inputs+=("$p=$out/timeline.$pw.$p.jsonl")
  done
  mkdir -p "$(dirname "$pout")"
  build/braid-bench plot "${inputs[@]}" --out "$pout" \
    --title "$pw: 400 workflows, concurrency 72, seed 21, $pkv-token device cache (braid sim, modeled time)"
fi

if has_part prefetch; then
  hf=${HOST_FACTOR:-4}
  echo
  echo "## Prefetch: pbkv with a host tier ($hf x the device), --prefetch off vs on (lru with the same tiers for reference)"
  echo
  echo "| workload | device tokens | policy | hit rate (device + host) | device hits | mean workflow latency | mean TTFT | prefetched blocks | used | wasted (evicted unused) | prefetch copy time |"
  echo "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for w in ${PREFETCH_WORKLOADS:-codegen factcheck}; do
    t=$(sweep_trace "$w")
    for d in ${PREFETCH_BUDGETS:-40000 140000}; do
      for run in "lru" "pbkv" "pbkv --prefetch"; do
        # shellcheck disable=SC2086
        build/braid sim --trace "$t" --kv-tokens "$d" --host-kv-tokens $((hf * d)) --policy $run --json 2> /dev/null | tail -1 |
          python3 -c '
import json, sys
r = json.load(sys.stdin); p = r["prompt_tokens"] or 1; pf = r["prefetched_blocks"]
name = r["policy"] + (" + prefetch" if r["prefetch"] else "")
waste = "%d (%.0f%%)" % (r["prefetch_wasted_blocks"], 100.0 * r["prefetch_wasted_blocks"] / pf) if pf else "0"
print("| %s | %s | %s | %.1f%% | %.1f%% | %.2f s | %.0f ms | %d | %d | %s | %.2f s |" % (sys.argv[1], sys.argv[2], name,
      100 * r["hit_rate"], 100 * r["device_cached_tokens"] / p, r["mean_workflow_latency_s"], 1e3 * r["mean_ttft_s"], pf,
      r["prefetch_hit_blocks"], waste, r["prefetch_copy_s"]))' "$w" "$d"
      done
    done
  done
fi

if has_part noise; then
  hf=${HOST_FACTOR:-4} nkv=${NOISE_KV:-80000}
  echo
  echo "## App. E: forecasts perturbed as (1 - lambda) P + lambda U; device $nkv tokens, host tier $hf x (graph predictor, seed 2)"
  echo
  echo "| workload | lambda | pbkv, device only | pbkv + host tier (PBKV-HE): hit rate (device) | + conservative prefetch: hit rate (device) | prefetched / used / wasted blocks |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  for w in ${NOISE_WORKLOADS:-factcheck codegen}; do
    t=$(sweep_trace "$w") train=$out/noise-train.$w.jsonl pred=$out/noise.$w.graph.bin
    [ -s "$train" ] || build/braid-bench gen --workload "$w" --workflows 400 --concurrency 72 --seed 2 --model "$model" --out "$train" 2> /dev/null
    [ -s "$pred" ] || build/braid train-predictor --traces "$train" --kind graph --out "$pred" > /dev/null 2> "$pred.log"
    for lambda in ${NOISE_LEVELS:-0 0.1 0.2 0.3 0.4 0.6 1}; do
      row="| $w | $lambda"
      for tiers in "" "--host-kv-tokens $((hf * nkv))" "--host-kv-tokens $((hf * nkv)) --prefetch"; do
        # shellcheck disable=SC2086 # tiers is an option list on purpose
        row="$row | $(build/braid sim --trace "$t" --kv-tokens "$nkv" $tiers --policy pbkv --predictor "$pred" \
          --prediction-noise "$lambda" --json 2> /dev/null | tail -1 | python3 -c '
import json, sys
r = json.load(sys.stdin); p = r["prompt_tokens"] or 1
cell = "%.1f%%" % (100 * r["hit_rate"])
if r["host_kv_tokens"]: cell += " (%.1f%%)" % (100 * r["device_cached_tokens"] / p)
if r["prefetch"]: cell += " | %d / %d / %d" % (r["prefetched_blocks"], r["prefetch_hit_blocks"], r["prefetch_wasted_blocks"])
print(cell)')"
      done
      echo "$row |"
    done
  done
fi
