#!/usr/bin/env bash
# Workload sweep of issue 15 ("First: make sure the workloads hold what the paper studies"): dry
# traces of the PBKV workloads (braid-bench gen), replayed by `braid sim` at several device cache
# sizes with each policy; prints one markdown table of token hit rates (lru / belady first: the
# headroom any policy has; kvflow / pbkv with an online Markov-1 predictor for information) and a
# second one describing the traces (requests, prompt sizes, the hit rate of an unbounded cache).
#   bench/workload_sweep.sh [OUT_DIR]
# Environment: WORKFLOWS / CONCURRENCY / SEED (400 / 72 / 21, the issue's sweep), BUDGETS (tokens,
# default "20000 40000 80000 160000"), WORKLOADS (default "codegen factcheck pipeline"),
# POLICIES (default "lru belady kvflow pbkv"). Traces already in OUT_DIR are reused; delete them
# after changing a generator.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/braid-workload-sweep}
mkdir -p "$out"
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
workloads=${WORKLOADS:-"codegen factcheck pipeline"}
budgets=${BUDGETS:-"20000 40000 80000 160000"}
policies=${POLICIES:-"lru belady kvflow pbkv"}
wf=${WORKFLOWS:-400} conc=${CONCURRENCY:-72} seed=${SEED:-21}

echo "# bench/workload_sweep.sh $out — $(date -u +%F), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "traces: braid-bench gen --workload W --workflows $wf --concurrency $conc --seed $seed; braid sim --kv-tokens N --policy P"

hit() {  # hit TRACE KV POLICY -> hit rate
  build/braid sim --trace "$1" --kv-tokens "$2" --policy "$3" --json 2> /dev/null | tail -1 |
    python3 -c 'import json, sys; print("%.2f" % json.load(sys.stdin)["hit_rate"])'
}

for w in $workloads; do
  t=$out/$w.jsonl
  [ -s "$t" ] || build/braid-bench gen --workload "$w" --workflows "$wf" --concurrency "$conc" --seed "$seed" \
    --model "$model" --out "$t" 2> "$out/$w.gen.log"
done

echo
echo "Token hit rate at $(echo "$budgets" | sed 's/ / \/ /g') cache tokens:"
echo
printf '| workload |'; for p in $policies; do printf ' %s |' "$p"; done; echo
printf '| --- |'; for p in $policies; do printf ' --- |'; done; echo
for w in $workloads; do
  printf '| %s |' "$w"
  for p in $policies; do
    cells=()
    for b in $budgets; do cells+=("$(hit "$out/$w.jsonl" "$b" "$p")"); done
    printf ' %s |' "$(IFS=/; echo "${cells[*]}" | sed 's/\// \/ /g')"
  done
  echo
done

echo
echo "The traces (prompt tokens per request: mean / p90 / max; unbounded cache: hit rate with a cache that never evicts):"
echo
echo "| workload | requests | calls per workflow | prompt tokens mean / p90 / max | unbounded cache |"
echo "| --- | ---: | ---: | --- | ---: |"
for w in $workloads; do
  inf=$(hit "$out/$w.jsonl" 100000000 lru)
  python3 - "$out/$w.jsonl" "$w" "$inf" <<'PY'
import json, sys
path, w, inf = sys.argv[1:]
p, wfs = [], set()
for line in open(path):
    o = json.loads(line)
    if "prompt_tokens" in o:
        p.append(o["prompt_tokens"]); wfs.add(o.get("workflow_id") or o.get("workflow"))
p.sort()
print("| %s | %d | %.1f | %d / %d / %d | %s |" % (w, len(p), len(p) / max(1, len(wfs)), sum(p) / len(p), p[int(0.9 * (len(p) - 1))], p[-1], inf))
PY
done
