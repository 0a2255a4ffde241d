#!/usr/bin/env bash
# Near-duplicate segment reuse (issue 35, MinHash/LSH) in the simulator: prefill skipped with
# approx-mode segment reuse, LSH off vs each arm (MODE:TAU_SEG, MODE = on | anywhere), side by side
# per workload, device cache size and window W. Deterministic (no timing). Prints a markdown table;
# appends nothing.
# Usage: bench/segment_lsh_sim.sh [OUT_DIR]  (env: WORKFLOWS=32 WORKLOADS="codegen templates"
#        KV_TOKENS="200000 40000" WINDOWS="0 64" ARMS="on:0.5 anywhere:0.5 on:0.3" TAU_CTX=0.5
#        BRAID_BIN BRAID_BENCH_BIN)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/segment_lsh_sim}
workflows=${WORKFLOWS:-32}
workloads=${WORKLOADS:-codegen templates}
kv_list=${KV_TOKENS:-200000 40000}
windows=${WINDOWS:-0 64}
arms=${ARMS:-on:0.5 anywhere:0.5 on:0.3}
tau_ctx=${TAU_CTX:-0.5}
mkdir -p "$out"
echo "| workload | device cache (tokens) | W | LSH (tau_seg) | segment-reused | prefill skipped | vs LSH off | LSH candidates / admitted | LSH tokens |"
echo "|---|---:|---:|---|---:|---:|---:|---:|---:|"
for wl in $workloads; do
  [ -s "$out/$wl.trace" ] || "$bench" gen --workload "$wl" --workflows "$workflows" --concurrency 8 --model "$model" \
    --out "$out/$wl.trace" --trace-tokens 2> "$out/$wl.gen.err"
  for kv in $kv_list; do
    for w in $windows; do
      for arm in off $arms; do
        lsh=${arm%%:*}; tau=${arm##*:}
        if [ "$arm" = off ]; then tau=0.5; fi
        j="$out/$wl.$kv.$w.$arm.json"
        "$braid" sim --trace "$out/$wl.trace" --kv-tokens "$kv" --model "$model" --segment-reuse approx --approx-window "$w" \
          --segment-lsh "$lsh" --segment-tau-seg "$tau" --segment-tau-ctx "$tau_ctx" --json 2> /dev/null | tail -1 > "$j"
        python3 - "$j" "$out/$wl.$kv.$w.off.json" "$wl" "$kv" "$w" "$arm" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); base = json.load(open(sys.argv[2]))
p = r["prompt_tokens"]; skip = r["cached_tokens"] + r["segment_reused_tokens"]
bskip = base["cached_tokens"] + base["segment_reused_tokens"]
arm = sys.argv[6] if sys.argv[6] == "off" else "{} ({})".format(*sys.argv[6].split(":"))
lsh = f'{r["segment_lsh_candidates"]} / {r["segment_lsh_admitted"]}' if r["segment_lsh"] else "-"
tok = r["segment_lsh_reused_tokens"] if r["segment_lsh"] else "-"
print(f"| {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {arm} | {100 * r['segment_reused_tokens'] / p:.2f}% | "
      f"{100 * skip / p:.2f}% | {skip / bskip:.3f}x | {lsh} | {tok} |")
PY
      done
    done
  done
done
