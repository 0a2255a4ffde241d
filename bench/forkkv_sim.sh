#!/usr/bin/env bash
# ForkKV's shared base cache in the simulator (issue 16; paper 002 § 5.1–5.2): replays react-lora
# and mapreduce-lora traces (8 workflows, all concurrent) with --lora-cache separate and shared at
# equal KV memory in bytes. For a separate cache of S tokens (S x 23040 bytes), shared mode gives
# the residual pool a share 1/D of the bytes and the base cache the rest: base S x (D-1)/D tokens,
# residual S x (23040 / 1920) / D tokens. Deterministic (a cost model, no timing); a few seconds.
# A replay with a cache that never evicts gives the measured memory ratios: per agent (bytes each
# adapter wrote into its own tree: separate full K/V vs shared residuals) and for the whole cache
# (peak bytes), beside the computed ones: kv_dim / rank, and the paper's 1 / (1/N + rank/kv_dim).
# Usage: bench/forkkv_sim.sh [OUT_DIR]  (env: WORKFLOWS=8 SHARES="6 4" REACT_SIZES="8192 10240 12288"
#        MAPREDUCE_SIZES="8192 12288 16384" UNBOUNDED=1000000 APPEND=0)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/forkkv_sim}
workflows=${WORKFLOWS:-8}
shares=${SHARES:-6 4}
unbounded=${UNBOUNDED:-1000000}
base_bpt=23040 # SmolLM2-135M: 30 layers x 2 x 192 halves
rank=16 kv_dim=192
mkdir -p "$out"

# sim WORKLOAD LABEL [braid sim options...]: one replay's JSON into $out/WORKLOAD.LABEL.json
sim() {
  local wl=$1 label=$2
  shift 2
  "$braid" sim --trace "$out/$wl.trace" --lora-rank "$rank" --kv-dim "$kv_dim" --kv-bytes-per-token "$base_bpt" --json "$@" \
    2> "$out/$wl.$label.err" | tail -1 > "$out/$wl.$label.json"
}

rows="$out/rows.txt"
: > "$rows"
for wl in react-lora mapreduce-lora; do
  "$bench" gen --workload "$wl" --workflows "$workflows" --concurrency "$workflows" --model "$model" --trace-tokens \
    --out "$out/$wl.trace" 2> "$out/$wl.gen.err"
  if [ "$wl" = react-lora ]; then sizes=${REACT_SIZES:-8192 10240 12288}; else sizes=${MAPREDUCE_SIZES:-8192 12288 16384}; fi
  for s in $sizes; do
    sim "$wl" "sep.$s" --kv-tokens "$s"
    echo "$wl $s separate - sep.$s" >> "$rows"
    for d in $shares; do
      base=$((s * (d - 1) / d)) residual=$((s * kv_dim / rank / d))
      sim "$wl" "shared.$s.$d" --kv-tokens "$base" --lora-cache shared --residual-tokens "$residual"
      echo "$wl $s shared 1/$d shared.$s.$d" >> "$rows"
    done
  done
  sim "$wl" sep.unbounded --kv-tokens "$unbounded"
  sim "$wl" shared.unbounded --kv-tokens "$unbounded" --lora-cache shared --residual-tokens "$unbounded"
done

table="$out/table.md"
python3 - "$out" "$rows" "$base_bpt" "$kv_dim" "$rank" > "$table" <<'PY'
import json, sys
out, rows, base_bpt, kv_dim, rank = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
load = lambda wl, label: json.load(open(f"{out}/{wl}.{label}.json"))
mb = lambda b: f"{b / 1e6:.1f}"
print("| workload | KV memory (MB) | mode | residual share | base / residual pool (tokens) | hit rate | computed tokens "
      "| fork tokens | partial tokens | peak KV memory (MB) | modeled time (s) | mean workflow latency (s) |")
print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for line in open(rows):
    wl, size, mode, share, label = line.split()
    r = load(wl, label)
    pools = f"{r['kv_tokens']} / {r['residual_tokens']}" if mode == "shared" else f"{r['kv_tokens']} / -"
    print(f"| {wl} | {mb(int(size) * base_bpt)} | {mode} | {share} | {pools} | {100 * r['hit_rate']:.1f}% | {r['computed_tokens']} "
          f"| {r['fork_tokens']} | {r['partial_tokens']} | {mb(r['peak_kv_bytes'])} | {r['modeled_latency_s']:.1f} "
          f"| {r['mean_workflow_latency_s']:.2f} |")
print()
print("Memory ratios, from replays with a cache that never evicts (separate / shared):")
print()
print("| workload | adapters N | per agent, computed kv_dim / rank | per agent, measured | whole cache, computed 1 / (1/N + rank/kv_dim) "
      "| whole cache, measured (peak bytes) | fork tokens (unbounded) |")
print("|---|---:|---:|---:|---:|---:|---:|")
for wl in ("react-lora", "mapreduce-lora"):
    sep, sh = load(wl, "sep.unbounded"), load(wl, "shared.unbounded")
    n = sh["adapters"]
    per_agent = sep["adapter_bytes"] / sh["adapter_bytes"]
    whole = sep["peak_kv_bytes"] / sh["peak_kv_bytes"]
    print(f"| {wl} | {n} | {kv_dim / rank:.2f} | {per_agent:.2f} | {1 / (1 / n + rank / kv_dim):.2f} | {whole:.2f} | {sh['fork_tokens']} |")
PY
cat "$table"
if [ "${APPEND:-0}" = 1 ]; then
  {
    echo
    echo "### braid sim --lora-cache ($(date -u +%Y-%m-%d))"
    echo
    echo "Command: \`WORKFLOWS=$workflows SHARES=\"$shares\" bench/forkkv_sim.sh\` (deterministic; no timing)"
    echo
    cat "$table"
  } >> "$root/bench/RESULTS.md"
fi
