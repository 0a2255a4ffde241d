#!/usr/bin/env bash
# test_golden_lora_qwen.sh — Braid's LoRA forward on Qwen2.5-Coder-0.5B (arch qwen2) against torch +
# peft, with the reference computed at test time (issue 36).
#
#   tests/golden/test_golden_lora_qwen.sh TEST_GOLDEN_LORA_BINARY
#
# 1. tools/lora_reference.py loads the Qwen GGUF into transformers (de-quantized there, as the
#    SmolLM2 golden fixture's weights are: nothing comes from a model hub), writes four rank-16
#    adapters (q/k/v/o of every layer, alpha 32, A = peft's init, B ~ N(0, STD), rounded to fp16)
#    through tools/train_lora.py's exporter, reads them back from the GGUF files and writes peft's
#    top-10 logits at every prompt position and 16 greedy tokens per adapter and prompt. K and V are
#    rounded to IEEE half before attention (--kv-fp16), as Braid's KV cache stores them: with
#    transformers' fp32 K/V the base model alone differed by 0.285 at one position of the plan prompt
#    (2e-3 with --kv-fp16; issue 36), the cache's rounding, which test_golden_qwen bounds, not LoRA's.
#    $BRAID_QWEN_ADAPTER_DIR (planner/coder/tester/summarizer.gguf) checks those adapters instead;
#    $BRAID_QWEN_REFERENCE_DIR (holding adapters/ROLE.gguf and golden/lora/lora_logits.jsonl, as step 1
#    writes them) skips step 1 and uses a reference computed before.
# 2. test_golden_lora runs on Qwen with those adapters (BRAID_TEST_MODEL / _ADAPTER_DIR / _GOLDEN_DIR)
#    and must PASS: top-10 logits within 5e-2 (mean 1e-2), greedy tokens equal, every adapter moving
#    the last logits by more than 1.0.
# 3. It must FAIL, on the first adapter's logits, for the same adapters with (a) alpha doubled (a wrong
#    LoRA scale) and (b) attn_v and attn_output left out (fewer target modules) — tools/lora_corrupt.py:
#    the tolerance catches a LoRA applied wrongly, it does not only pass a right one.
# Skips (77) unless BRAID_QWEN_LORA_GOLDEN=1, and when the Qwen GGUF (scripts/fetch-model.sh qwen; $BRAID_QWEN_MODEL) or a Python with
# torch, transformers, peft and gguf (tools/setup_tools_venv.sh; $BRAID_TOOLS_PY) is missing.
# Cost: about 3 minutes of one core for the reference (most of it de-quantizing the base), 1-2 for Braid.
set -euo pipefail
golden_bin=${1:?usage: test_golden_lora_qwen.sh TEST_GOLDEN_LORA_BINARY}
root=$(cd "$(dirname "$0")/../.." && pwd)
py=${BRAID_TOOLS_PY:-$root/.venv-tools/bin/python}
model=${BRAID_QWEN_MODEL:-$root/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
std=${BRAID_QWEN_LORA_STD:-0.05}

# Opt-in because it costs minutes of CPU (the reference: ~3 min of one core quiet, 25 min wall at load
# average 17). Passed 2026-11-28 05:40 UTC with --kv-fp16: base 2.0e-3, adapters <= 1.8e-2; alpha x2 caught
# at 27, no v/o at 18 (before --kv-fp16 the base record failed at 0.285: the fp16 cache, see step 1).
if [ "${BRAID_QWEN_LORA_GOLDEN:-0}" != 1 ]; then
  echo "skip: set BRAID_QWEN_LORA_GOLDEN=1 to run the Qwen LoRA golden check (minutes of CPU)"
  exit 77
fi
if [ ! -f "$model" ]; then
  echo "skip: no Qwen GGUF at $model (scripts/fetch-model.sh qwen)"
  exit 77
fi
if [ ! -x "$py" ] || ! "$py" -c 'import torch, transformers, peft, gguf' 2>/dev/null; then
  echo "skip: no Python with torch, transformers, peft and gguf at $py (tools/setup_tools_venv.sh)"
  exit 77
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
trap 'exit 1' INT TERM  # so that ctest's timeout still runs the EXIT trap
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

adapters=${BRAID_QWEN_ADAPTER_DIR:-}
golden=$work/golden
if [ -n "${BRAID_QWEN_REFERENCE_DIR:-}" ]; then
  adapters=$BRAID_QWEN_REFERENCE_DIR/adapters golden=$BRAID_QWEN_REFERENCE_DIR/golden
  [ -f "$golden/lora/lora_logits.jsonl" ] || fail "no $golden/lora/lora_logits.jsonl"
  echo "reference: precomputed in $BRAID_QWEN_REFERENCE_DIR"
else
  make_random=()
  if [ -z "$adapters" ]; then
    adapters=$work/adapters
    make_random=(--make-random "$std")
  fi
  echo "reference: peft on $model, adapters $adapters ${make_random[*]}"
  start=$(date +%s)
  "$py" "$root/tools/lora_reference.py" --model "$model" --adapters "$adapters" --out "$golden" --threads 1 --kv-fp16 \
    "${make_random[@]}" || fail "tools/lora_reference.py failed"
  echo "reference took $(( $(date +%s) - start )) s"
fi

# run_golden ADAPTER_DIR LOG: test_golden_lora on Qwen against the reference; its exit status.
run_golden() {
  BRAID_TEST_MODEL=$model BRAID_TEST_ADAPTER_DIR=$1 BRAID_TEST_GOLDEN_DIR=$golden "$golden_bin" > "$2" 2>&1
}

start=$(date +%s)
if ! run_golden "$adapters" "$work/good.log"; then
  cat "$work/good.log"
  fail "Braid's LoRA logits on Qwen differ from peft's"
fi
grep '^lora golden:' "$work/good.log"
echo "braid took $(( $(date +%s) - start )) s"
[ "$(grep -c '^lora golden:' "$work/good.log")" -ge 15 ] || fail "expected 15 compared records (3 prompts x base + 4 adapters)"

# A defect must be caught by the comparison itself (the base records pass, the first adapter's fails),
# not by a load error.
expect_caught() { # label lora_corrupt-args...
  local label=$1
  shift
  "$py" "$root/tools/lora_corrupt.py" --in "$adapters" --out "$work/$label" "$@" > /dev/null || fail "lora_corrupt $label"
  if run_golden "$work/$label" "$work/$label.log"; then
    cat "$work/$label.log"
    fail "adapters with $label passed the golden check: its tolerance does not catch that"
  fi
  grep -q '^lora golden: (base)' "$work/$label.log" || { cat "$work/$label.log"; fail "$label: the check never compared logits"; }
  grep -q '^lora golden: planner' "$work/$label.log" || { cat "$work/$label.log"; fail "$label: failed before comparing an adapter"; }
  echo "caught ($label): $(grep '^lora golden: planner' "$work/$label.log" | head -1)"
}
expect_caught alpha-x2 --alpha-scale 2
expect_caught no-v-o --drop-targets attn_v,attn_output
echo "PASS: LoRA on qwen2 matches peft; a doubled alpha and missing v/o targets are caught"
