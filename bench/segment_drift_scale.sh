#!/usr/bin/env bash
# Segment reuse drift at scale (issue 35): the same calls side by side with reuse off, exact and
# approximate arms, through `braid batch` on the real model (greedy, MAX_TOKENS each, first-token
# logits kept). Per arm: prompt tokens, prefix-cached, segment-reused, prefill saved (reuse alone and
# with the prefix cache), first-token changes, MAX_TOKENS-token agreement, KL of the first token's
# distribution, probes admitted / rejected; then, for the approximate arms, which calls diverged:
# those that reused spans themselves, and those that reused nothing themselves but continued a
# workflow whose earlier call did (approximate K/V taken through the prefix cache).
# Usage: bench/segment_drift_scale.sh [OUT_DIR]
#   env: WORKLOADS="codegen templates"  WORKFLOWS_codegen=8 SCALE_codegen=0.25  WORKFLOWS_templates=24
#        SCALE_templates=0.5  MAX_TOKENS=16 MAX_RUNNING=4 THREADS=2 WINDOW=64
#        ARMS="off exact approx approx_noprefix" (names below: approx = the CLI's defaults, approx_old = the
#        defaults before issue 35's third pass, approx_shape = SHAPE_VALUES/SHAPE_MIN_SPAN/SHAPE_TAIL; `diag` probes every approximate span
#        whole: nothing reused, a probe_layers event per span for the per-layer cosine table)
# Prints Markdown tables (also OUT_DIR/table.md); never edits RESULTS.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/segment_drift_scale}
workloads=${WORKLOADS:-codegen templates}
max_tokens=${MAX_TOKENS:-16}
max_running=${MAX_RUNNING:-4}
threads=${THREADS:-2}
window=${WINDOW:-64}
arms=${ARMS:-off exact approx approx_noprefix}
mkdir -p "$out"

arm_flags() {  # the braid batch flags of an arm
  case $1 in
    off) echo "--segment-reuse off" ;;
    exact) echo "--segment-reuse exact" ;;
    approx) echo "--segment-reuse approx --approx-window $window" ;;  # the CLI's defaults, whatever they are
    # The defaults before issue 35's third pass (key probe only, no span shape), for old-vs-new rows.
    approx_old) echo "--segment-reuse approx --approx-window $window --approx-prefix on --segment-probe-values off --segment-min-span 0 --segment-tail 0" ;;
    approx_values) echo "--segment-reuse approx --approx-window $window --segment-probe-values on --segment-min-span 0 --segment-tail 0" ;;
    approx_shape) echo "--segment-reuse approx --approx-window $window --segment-probe-values ${SHAPE_VALUES:-off} --segment-min-span ${SHAPE_MIN_SPAN:-32} --segment-tail ${SHAPE_TAIL:-8}" ;;
    approx_noprefix) echo "--segment-reuse approx --approx-window $window --approx-prefix off" ;;
    approx_unguarded) echo "--segment-reuse approx --approx-window $window --segment-probe-tokens 0 --approx-prefix on" ;;
    approx_strict) echo "--segment-reuse approx --approx-window $window --segment-probe-min-cos 0.999 --approx-prefix off" ;;
    diag) echo "--segment-reuse approx --approx-window $window --segment-probe-tokens all --segment-probe-min-cos -1" ;;
    *) echo "unknown arm $1" >&2; exit 2 ;;
  esac
}

for wl in $workloads; do
  if [ ! -s "$out/$wl.in.jsonl" ]; then
    wf_var=WORKFLOWS_$wl sc_var=SCALE_$wl
    "$bench" gen --workload "$wl" --workflows "${!wf_var:-8}" --concurrency 4 --scale "${!sc_var:-0.5}" --model "$model" \
      --out "$out/$wl.trace" --batch-out "$out/$wl.batch.jsonl" 2> "$out/$wl.gen.err"
    python3 - "$out/$wl.batch.jsonl" "$out/$wl.in.jsonl" "$max_tokens" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        r = json.loads(line); r["max_tokens"] = int(sys.argv[3]); r.pop("segment_reuse", None)
        f.write(json.dumps(r) + "\n")
PY
  fi
  for arm in $arms; do
    [ -s "$out/$wl.$arm.jsonl" ] && continue
    echo "[drift-scale] $wl: $arm ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg))" >&2
    t0=$SECONDS
    # shellcheck disable=SC2046
    "$braid" batch --model "$model" --input "$out/$wl.in.jsonl" --output "$out/$wl.$arm.jsonl" --logits-out "$out/$wl.$arm.logits" \
      --events "$out/$wl.$arm.events" --max-running "$max_running" --threads "$threads" $(arm_flags "$arm") \
      2> "$out/$wl.$arm.err" > /dev/null
    echo "$((SECONDS - t0)) $(cut -d' ' -f1 /proc/loadavg)" > "$out/$wl.$arm.secs"
  done
done

python3 "$root/bench/segment_drift_table.py" "$out" "$max_tokens" "$workloads" "$arms" | tee "$out/table.md"
