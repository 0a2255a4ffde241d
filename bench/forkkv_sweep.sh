#!/usr/bin/env bash
# ForkKV's sweeps in the simulator (issue 36; paper 002 Fig. 3/12, 13, 14c, 15): --lora-cache separate,
# shared and auto at equal KV memory in bytes (as bench/forkkv_sim.sh: shared and auto give 1/D of
# the bytes to the residual pool) on react-lora and mapreduce-lora, varying one thing at a time from
# the base point (8 workflows, all concurrent, rank 16, outputs capped at MAX_TOKENS, scale 1):
#   workflows   N in WORKFLOW_SET, all concurrent           (number of workflows, Fig. 3/12)
#   concurrency C in CONCURRENCY_SET workflows at once, of 8 (arrival rate: the replay serves in
#               arrival order, so fewer at once = slower arrivals, less interleaving; Fig. 13)
#   rank        R in RANK_SET (a residual token is kv_dim / R times smaller than a base token; the
#               residual pool keeps its 1/D share of the bytes, so it holds fewer tokens; Fig. 15a)
#   output      L in OUTPUT_SET: every request's output_tokens capped at L in the trace (as the live
#               bench's --max-tokens-cap; the prompts keep the workload's history; Fig. 15b)
#   scale       X in SCALE_SET: every prompt part and output length x X (context length)
# Forked requests pay ResidualAttention's extra time (braid sim --residual-attention ATTN, default cpu:
# the committed CPU probe; none = the sim's flat per-token costs alone, the issue-36 first table).
# Batch size (Fig. 14c): the replay serves one request at a time, so it is not a replay output; the
# table gives the decode batch whose K/V fits the bytes, computed from the trace (mean request
# tokens n, shared context c): separate M / n, shared (M - c) / ((n - c) + n x rank / kv_dim).
# Deterministic; ~3 min on the loaded 2-core dev machine.
# Usage: bench/forkkv_sweep.sh [OUT_DIR]  (env: REACT_TOKENS=10240 MAPREDUCE_TOKENS=12288
#        REACT_SHARE=6 MAPREDUCE_SHARE=4 ATTN=cpu MAX_TOKENS=64 (0 = the workload's own lengths)
#        WORKFLOW_SET="1 2 4 8 16" CONCURRENCY_SET="1 2 4 8" RANK_SET="8 16 32 64" OUTPUT_SET="16 64 256"
#        SCALE_SET="0.5 1 2" SWEEPS="workflows concurrency rank output scale" WORKLOADS="react-lora mapreduce-lora"
#        AUTO_SHARE=D (auto's residual share 1/AUTO_SHARE; default the workload's D, as shared)
#        POOL=fixed|unified (unified: shared and auto get all S tokens of KV with --residual-pool unified,
#        residuals living in base blocks they borrow; the shares D and AUTO_SHARE are then unused)
#        TRACES=OUT_DIR (where traces are generated and reused), AUTO_COST=N (braid sim --auto-cost N for the
#        auto arm; default the sim's, 4; 2 reproduces the early-morning issue-36 figures))
# Writes OUT_DIR/sweep.md (one row per point, the three modes side by side, time ratios = throughput
# ratios, since every arm serves the same requests) and OUT_DIR/points.jsonl.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/forkkv_sweep}
attn=${ATTN:-cpu} cap=${MAX_TOKENS:-64}
base_bpt=23040 kv_dim=192 # SmolLM2-135M: 30 layers x 2 x 192 halves a token
mkdir -p "$out"
table=$out/sweep.md points=$out/points.jsonl
: > "$points"
{
  echo "| workload | swept | value | KV MB | hit: sep / shared / auto | computed tokens: sep / shared / auto | modeled s: sep / shared / auto | ResidualAttention s: shared / auto | auto forked / separate | shared throughput / sep | auto throughput / sep | decode batch fits: sep / shared |"
  echo "|---|---|---:|---:|---|---|---|---|---:|---:|---:|---|"
} > "$table"

# trace WORKLOAD WORKFLOWS CONCURRENCY SCALE OUTPUT_CAP: the trace's path (generated once, capped copy).
trace() {
  local wl=$1 wf=$2 conc=$3 scale=$4 oc=$5
  local t=${TRACES:-$out}/$wl.$wf.$conc.$scale.trace
  [ -s "$t" ] || "$bench" gen --workload "$wl" --workflows "$wf" --concurrency "$conc" --scale "$scale" --model "$model" \
    --trace-tokens --out "$t" 2> "$t.err"
  [ "$oc" = 0 ] && { echo "$t"; return; }
  local c=$t.cap$oc
  [ -s "$c" ] || python3 - "$t" "$oc" > "$c" <<'PY'
import json, sys
cap = int(sys.argv[2])
for line in open(sys.argv[1]):
    o = json.loads(line)
    if o.get("type") == "request": o["output_tokens"] = min(o["output_tokens"], cap)
    print(json.dumps(o, separators=(",", ":")))
PY
  echo "$c"
}

# point WORKLOAD SWEPT VALUE WORKFLOWS CONCURRENCY RANK SCALE OUTPUT_CAP: one trace, three modes, one row.
point() {
  local wl=$1 swept=$2 value=$3 wf=$4 conc=$5 rank=$6 scale=$7 oc=$8 s d
  if [ "$wl" = react-lora ]; then s=${REACT_TOKENS:-10240} d=${REACT_SHARE:-6}; else s=${MAPREDUCE_TOKENS:-12288} d=${MAPREDUCE_SHARE:-4}; fi
  local tr
  tr=$(trace "$wl" "$wf" "$conc" "$scale" "$oc")
  local common=(--trace "$tr" --lora-rank "$rank" --kv-dim "$kv_dim" --kv-bytes-per-token "$base_bpt" --residual-attention "$attn" --json)
  local fork=(--kv-tokens $((s * (d - 1) / d)) --residual-tokens $((s * kv_dim / rank / d))) ad=${AUTO_SHARE:-$d}
  local fork_auto=(--kv-tokens $((s * (ad - 1) / ad)) --residual-tokens $((s * kv_dim / rank / ad)))
  if [ "${POOL:-fixed}" = unified ]; then fork=(--kv-tokens "$s" --residual-pool unified) fork_auto=("${fork[@]}"); fi
  "$braid" sim "${common[@]}" --kv-tokens "$s" 2> /dev/null | tail -1 > "$out/p.sep.json"
  "$braid" sim "${common[@]}" "${fork[@]}" --lora-cache shared 2> /dev/null | tail -1 > "$out/p.sh.json"
  "$braid" sim "${common[@]}" "${fork_auto[@]}" --lora-cache auto ${AUTO_COST:+--auto-cost "$AUTO_COST"} 2> /dev/null | tail -1 > "$out/p.auto.json"
  local ctx=$(python3 -c "print(int(4096 * $scale))")
  python3 - "$out" "$tr" "$wl" "$swept" "$value" "$s" "$base_bpt" "$rank" "$kv_dim" "$ctx" "$points" >> "$table" <<'PY'
import json, sys
out, tr, wl, swept, value = sys.argv[1:6]
s, bpt, rank, kv_dim, ctx = (int(x) for x in sys.argv[6:11])
sep, sh, au = (json.load(open(f"{out}/p.{m}.json")) for m in ("sep", "sh", "auto"))
reqs = [json.loads(l) for l in open(tr)]
reqs = [r for r in reqs if r.get("type") == "request"]
n = sum(r["prompt_tokens"] + r["output_tokens"] for r in reqs) / len(reqs)
fit_sep = s / n
fit_sh = max(0.0, s - ctx) / ((n - ctx) + n * rank / kv_dim) if n > ctx else float("nan")
t = lambda r: r["modeled_latency_s"]
hit = lambda r: f"{100 * r['hit_rate']:.1f}%"
print(f"| {wl} | {swept} | {value} | {s * bpt / 1e6:.1f} | {hit(sep)} / {hit(sh)} / {hit(au)} "
      f"| {sep['computed_tokens']} / {sh['computed_tokens']} / {au['computed_tokens']} | {t(sep):.1f} / {t(sh):.1f} / {t(au):.1f} "
      f"| {sh['fork_attention_s']:.1f} / {au['fork_attention_s']:.1f} | {au['forked_requests']} / {au['separate_adapted_requests']} "
      f"| {t(sep) / t(sh):.2f}x | {t(sep) / t(au):.2f}x | {fit_sep:.1f} / {fit_sh:.1f} |")
with open(sys.argv[11], "a") as f:
    f.write(json.dumps({"workload": wl, "swept": swept, "value": value, "kv_mb": s * bpt / 1e6, "separate": sep, "shared": sh,
                        "auto": au, "sep_over_shared": t(sep) / t(sh), "sep_over_auto": t(sep) / t(au), "fit_sep": fit_sep,
                        "fit_shared": fit_sh}) + "\n")
PY
  tail -1 "$table" >&2
}

for wl in ${WORKLOADS:-react-lora mapreduce-lora}; do
  for sweep in ${SWEEPS:-workflows concurrency rank output scale}; do
    case $sweep in
      workflows) for n in ${WORKFLOW_SET:-1 2 4 8 16}; do point "$wl" workflows "$n" "$n" "$n" 16 1 "$cap"; done ;;
      concurrency) for c in ${CONCURRENCY_SET:-1 2 4 8}; do point "$wl" concurrency "$c" 8 "$c" 16 1 "$cap"; done ;;
      rank) for r in ${RANK_SET:-8 16 32 64}; do point "$wl" rank "$r" 8 8 "$r" 1 "$cap"; done ;;
      output) for l in ${OUTPUT_SET:-16 64 256}; do point "$wl" output "$l" 8 8 16 1 "$l"; done ;;
      scale) for x in ${SCALE_SET:-0.5 1 2}; do point "$wl" scale "$x" 8 8 16 "$x" "$cap"; done ;;
      *) echo "forkkv_sweep.sh: unknown sweep '$sweep'" >&2; exit 2 ;;
    esac
  done
done
rm -f "$out/p.sep.json" "$out/p.sh.json" "$out/p.auto.json"
cat "$table"
