#!/usr/bin/env bash
# The PBKV scoreboard in the simulator: token hit rate of lru / kvflow / pbkv / belady on dry
# traces of the dynamic loops (codegen, factcheck) and the static pipeline, at several device
# budgets, with the share of the LRU -> Belady gap pbkv closes; pbkv with a predictor trained on
# other traces (braid train-predictor) next to one learning online; next-agent accuracy at K = 1..4.
#   bench/pbkv_study.sh [OUT_DIR]
# Environment: WORKFLOWS / CONCURRENCY (200 / 16), BUDGETS (tokens, default "32768 65536 131072"),
# WORKLOADS (default "codegen factcheck pipeline").
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/braid-pbkv}
mkdir -p "$out"
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
workloads=${WORKLOADS:-"codegen factcheck pipeline"}
budgets=${BUDGETS:-"32768 65536 131072"}
wf=${WORKFLOWS:-200} conc=${CONCURRENCY:-16}

echo "# bench/pbkv_study.sh $out — $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "traces: braid-bench gen --workflows $wf --concurrency $conc --seed 1 (evaluated) and --seed 2 (predictor training)"

hit() {  # hit TRACE KV POLICY [args] -> "hit_rate latency"
  local trace=$1 kv=$2 policy=$3; shift 3
  build/braid sim --trace "$trace" --kv-tokens "$kv" --policy "$policy" --json "$@" 2> /dev/null | tail -1 |
    python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["hit_rate"], r["mean_workflow_latency_s"])'
}

for w in $workloads; do
  for seed in 1 2; do
    t=$out/$w.s$seed.jsonl
    [ -s "$t" ] || build/braid-bench gen --workload "$w" --workflows "$wf" --concurrency "$conc" --seed "$seed" \
      --model "$model" --out "$t" 2> /dev/null
  done
  build/braid train-predictor --traces "$out/$w.s2.jsonl" --out "$out/$w.markov1.bin" --kind markov1 \
    --eval "$out/$w.s1.jsonl" > /dev/null 2> "$out/$w.markov1.train.log"
  build/braid train-predictor --traces "$out/$w.s2.jsonl" --out "$out/$w.markov2.bin" --kind markov2 \
    --eval "$out/$w.s1.jsonl" > /dev/null 2> "$out/$w.markov2.train.log"
done

echo
echo "## Token hit rate (modeled mean workflow latency) per policy"
echo
echo "| workload | budget | lru | kvflow | pbkv (online Markov-1) | pbkv (trained Markov-2) | belady | gap closed by pbkv | pbkv / lru | pbkv / kvflow |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
for w in $workloads; do
  t=$out/$w.s1.jsonl
  for b in $budgets; do
    read -r lru lru_l <<< "$(hit "$t" "$b" lru)"
    read -r kvf kvf_l <<< "$(hit "$t" "$b" kvflow)"
    read -r pb pb_l <<< "$(hit "$t" "$b" pbkv)"
    read -r pbt pbt_l <<< "$(hit "$t" "$b" pbkv --predictor "$out/$w.markov2.bin")"
    read -r bel bel_l <<< "$(hit "$t" "$b" belady)"
    python3 - "$w" "$b" "$lru" "$lru_l" "$kvf" "$kvf_l" "$pb" "$pb_l" "$pbt" "$pbt_l" "$bel" "$bel_l" <<'PY'
import sys
w, b = sys.argv[1], sys.argv[2]
v = list(map(float, sys.argv[3:]))
lru, kvf, pb, pbt, bel = v[0], v[2], v[4], v[6], v[8]
cell = lambda h, l: "%.1f%% (%.1f s)" % (100 * h, l)
gap = "%.0f%%" % (100 * (pb - lru) / (bel - lru)) if bel - lru > 1e-4 else "n/a"
print("| %s | %s | %s | %s | %s | %s | %s | %s | %.2fx | %.2fx |" % (w, b, cell(v[0], v[1]), cell(v[2], v[3]), cell(v[4], v[5]),
      cell(v[6], v[7]), cell(v[8], v[9]), gap, pb / lru if lru else 0, pb / kvf if kvf else 0))
PY
  done
done

echo
echo "## Next-agent accuracy (top-1 per step; trained on seed 2, evaluated on seed 1)"
echo
for w in $workloads; do
  for k in markov1 markov2; do
    echo "$w $k: $(grep -i 'held-out\|eval' "$out/$w.$k.train.log" | tail -1)"
  done
done
