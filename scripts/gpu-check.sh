#!/usr/bin/env bash
# Everything that needs a GPU, in one command: the gpu-labelled tests, compute-sanitizer
# (memcheck and racecheck) over a prefill + graph-decode run and a batched run, and the CUDA
# benchmarks (default model; synthetic Llama-3-8B shape). Logs go to OUTDIR, a summary to stdout.
#   scripts/gpu-check.sh BIN_DIR MODEL.gguf OUTDIR [tests|sanitize|bench|all]...
# BIN_DIR holds braid, bench_cuda, test_cuda_backend and test_engine, and optionally
# test_residual_attention_cuda and test_lora_cuda (a CUDA build, e.g.
# build/ and build/tests/ copied together). Run from the repository root (golden files).
set -uo pipefail
bin=${1:?BIN_DIR}; model=${2:?MODEL}; out=${3:?OUTDIR}; shift 3
parts=${*:-all}
mkdir -p "$out"
export BRAID_TEST_MODEL=$model BRAID_TEST_GOLDEN_DIR=$PWD/tests/golden BRAID_TEST_ADAPTER_DIR=$PWD/adapters
status=0
want() { [[ " $parts " == *" all "* || " $parts " == *" $1 "* ]]; }
step() { # step NAME TIMEOUT CMD...: runs CMD with its log in OUTDIR/NAME.log, reports pass/fail
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  printf '%-28s rc=%-3d %4ds\n' "$name" "$rc" $((SECONDS - t0))
  [[ $rc -eq 0 ]] || status=1
}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
prompt="What is the capital of France?"
printf '{"id":"a","prompt":"Once upon a time","max_tokens":6}\n{"id":"b","prompt":"Once upon a time there was","max_tokens":6}\n{"id":"c","prompt":"def add(a, b):","max_tokens":6}\n' > "$out/sanitize_requests.jsonl"
if want tests; then
  step test_cuda_backend 400 "$bin/test_cuda_backend"
  step test_engine_cuda 400 env BRAID_TEST_DEVICE=cuda "$bin/test_engine"
  if [[ -x $bin/test_residual_attention_cuda ]]; then
    step test_residual_attention_cuda 300 "$bin/test_residual_attention_cuda"
  fi
  if [[ -x $bin/test_lora_cuda ]]; then # adapters and ForkKV in the CUDA backend vs the CPU backend
    step test_lora_cuda 400 "$bin/test_lora_cuda"
  fi
fi
if want sanitize; then
  step sanitize_memcheck_generate 300 "$sanitizer" --tool memcheck --error-exitcode 9 \
    "$bin/braid" generate --device cuda --model "$model" --chat --prompt "$prompt" --max-tokens 6
  # racecheck does not model the Hopper async-copy barriers inside cuBLAS's own kernels (nvjet_*)
  # and reports their shared-memory traffic as races (and its kernel filter crashed the tool on
  # that machine), so it runs over everything and only races in other kernels fail the step.
  step sanitize_racecheck_generate 400 "$sanitizer" --tool racecheck \
    "$bin/braid" generate --device cuda --model "$model" --chat --prompt "$prompt" --max-tokens 6
  ours=$(grep "Race reported" "$out/sanitize_racecheck_generate.log" | grep -vc nvjet)
  printf '%-28s %s race reports outside cuBLAS kernels\n' racecheck_braid_kernels "$ours"
  [[ $ours -eq 0 ]] || status=1
  if [[ -x $bin/test_residual_attention_cuda ]]; then # ForkKV kernels: shared-memory stages and their barriers
    step sanitize_memcheck_residual 300 "$sanitizer" --tool memcheck --error-exitcode 9 "$bin/test_residual_attention_cuda"
    step sanitize_racecheck_residual 300 "$sanitizer" --tool racecheck --error-exitcode 9 "$bin/test_residual_attention_cuda"
  fi
  if [[ -x $bin/test_lora_cuda ]]; then # the CUDA backend's adapter path: tables, residual pool, metadata bounds
    step sanitize_memcheck_lora 600 "$sanitizer" --tool memcheck --error-exitcode 9 "$bin/test_lora_cuda"
  fi
  step sanitize_memcheck_batch 300 "$sanitizer" --tool memcheck --error-exitcode 9 \
    "$bin/braid" batch --device cuda --model "$model" --input "$out/sanitize_requests.jsonl" --output "$out/sanitize_out.jsonl"
fi
if want profile; then # per-kernel GPU time of decode steps (non-graph launches, after the warm-up)
  for spec in "$model 1" "$model 64" "synthetic:llama3-8b 1" "synthetic:llama3-8b 64"; do
    set -- $spec
    step "profile_$(basename "$1" | tr ':.' '__')_b$2" 200 ncu --launch-skip 2500 --launch-count 700 --print-summary per-kernel \
      --metrics gpu__time_duration.sum "$bin/bench_cuda" --model "$1" --no-ceilings --no-graphs --batches "$2" --steps 16 --prefill 0
  done
fi
if want bench; then
  step bench_default 300 "$bin/bench_cuda" --model "$model" --batches 1,16,64,256 --prefill 512
  step bench_llama3_8b 300 "$bin/bench_cuda" --model synthetic:llama3-8b --no-ceilings --batches 1,64 --steps 32 --prefill 4096
fi
echo "--- results"
grep -h -E "^(ceilings|decode|prefill)|all prompts|agree on all|^(separate|ForkKV|base-only)|ERROR|FAILED|PASSED|ERROR SUMMARY|parts at" "$out"/*.log | head -80
exit $status
