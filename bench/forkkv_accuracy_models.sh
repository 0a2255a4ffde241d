#!/usr/bin/env bash
# forkkv_accuracy_models.sh — ForkKV's accuracy on two model families side by side (issue 36: is the
# 99.0 % layer-input cosine SmolLM2-135M's or the method's?).
#
#   bench/forkkv_accuracy_models.sh OUT_DIR
#
# For SmolLM2-135M (the committed adapters/) and Qwen2.5-Coder-0.5B (adapters trained here with the
# same data, rank, alpha, targets, steps and seeds by tools/train_lora.py; ~4.3 MB each, so they are
# regenerated, not committed), it writes a react-lora trace per model with the model's tokenizer and
# runs bench_forkkv_accuracy with --controls (forkkv, full reuse, forkkv with B = A, base model) on
# the trained adapters and on synthetic rank-16 adapters (the same random recipe on both models).
# Environment:
#   BUILD=build            where bench_forkkv_accuracy and braid-bench are
#   PY=.venv-tools/bin/python   tools/setup_tools_venv.sh builds it (torch, transformers, peft, gguf)
#   QWEN=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf   SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
#   QWEN_ADAPTERS=OUT_DIR/qwen-adapters  (trained when planner.gguf is missing there)
#   ROLES=planner,coder,summarizer  STEPS=30  BATCH=4  THREADS=1   (training; react-lora uses these three,
#                                          tester is not needed; the committed SmolLM2 adapters: 30 steps, batch 4)
#   CONTEXT=256 REQUESTS=4 GENERATE=16 SEED=5   (trace and cases; the 2026-11-25/26 figures used
#                                          CONTEXT=1024 REQUESTS=12)
#   ARMS="trained synthetic"  MODELS="smol qwen"   (which arms and models run, in that order)
# Training is CPU-bound (about 20 core-seconds a step for the 0.5B model at batch 4); the measurement
# is fp32 prefill on the CPU (about 8 prompt-lengths of forward per case with --controls).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/forkkv_accuracy_models.sh OUT_DIR}
mkdir -p "$out"
BUILD=${BUILD:-build} PY=${PY:-.venv-tools/bin/python}
QWEN=${QWEN:-models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf} SMOL=${SMOL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
QWEN_ADAPTERS=${QWEN_ADAPTERS:-$out/qwen-adapters} ROLES=${ROLES:-planner,coder,summarizer}
STEPS=${STEPS:-30} BATCH=${BATCH:-4} THREADS=${THREADS:-1} CONTEXT=${CONTEXT:-256} REQUESTS=${REQUESTS:-4} GENERATE=${GENERATE:-16}
SEED=${SEED:-5} ARMS=${ARMS:-trained synthetic} MODELS=${MODELS:-smol qwen}

if [[ " $ARMS " == *" trained "* && ! -f "$QWEN_ADAPTERS/planner.gguf" ]]; then
  echo "[models] training $ROLES on $QWEN ($STEPS steps of $BATCH each) -> $QWEN_ADAPTERS" >&2
  start=$(date +%s)
  "$PY" tools/train_lora.py --model "$QWEN" --out "$QWEN_ADAPTERS" --golden '' --roles "$ROLES" --steps "$STEPS" \
    --batch "$BATCH" --threads "$THREADS" 2>&1 | tee "$out/qwen-train.log" >&2
  echo "[models] training took $(( $(date +%s) - start )) s" >&2
fi

run() { # model-tag model-path arm lora-args...
  local tag=$1 model=$2 arm=$3
  shift 3
  echo "### $tag, $arm adapters ($(date -u +%FT%TZ), load: $(cut -d' ' -f1-3 /proc/loadavg))"
  local TIMEFORMAT="(%R s wall, %U s user CPU)"
  { time "$BUILD/bench_forkkv_accuracy" --model "$model" --trace "$out/$tag-react.jsonl" "$@" --requests "$REQUESTS" \
    --generate "$GENERATE" --controls 2> "$out/$tag-$arm.err"; } 2>&1
  echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo
}

for tag in $MODELS; do
  model=$SMOL
  [ "$tag" = qwen ] && model=$QWEN
  "$BUILD/braid-bench" gen --workload react-lora --workflows 8 --concurrency 8 --context-tokens "$CONTEXT" --trace-tokens \
    --seed "$SEED" --model "$model" --out "$out/$tag-react.jsonl" >&2
done

synthetic=(--lora lora-planner=synthetic:16:1 --lora lora-actor=synthetic:16:2 --lora lora-answerer=synthetic:16:3)
{
  for arm in $ARMS; do
    for tag in $MODELS; do
      if [ "$arm" = synthetic ]; then
        run "$tag" "$([ $tag = qwen ] && echo "$QWEN" || echo "$SMOL")" synthetic "${synthetic[@]}"
      else
        dir=adapters
        [ "$tag" = qwen ] && dir=$QWEN_ADAPTERS
        run "$tag" "$([ $tag = qwen ] && echo "$QWEN" || echo "$SMOL")" trained --lora "lora-planner=$dir/planner.gguf" \
          --lora "lora-actor=$dir/coder.gguf" --lora "lora-answerer=$dir/summarizer.gguf"
      fi
    done
  done
} | tee "$out/tables.md"
