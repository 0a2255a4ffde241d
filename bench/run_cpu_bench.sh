#!/usr/bin/env bash
# Braid side by side with llama.cpp on the CPU, same GGUF, same thread count, one command:
#   pp512      prompt processing of 512 tokens              (bench_cpu       | llama-bench -p 512)
#   tg128      single-stream decode of 128 tokens           (bench_cpu       | llama-bench -n 128)
#   tg128@4K   the same decode after 4096 tokens of context (bench_cpu -p 4096 | llama-bench -d 4096)
#   B=16, 64   decode-phase tok/s of 16 / 64 sequences of ~130-token prompts decoding 64 tokens each
#              (braid batch on bench/batch_workload.py | llama-batched-bench -npp <same> -ntg 64)
#
#   [LLAMA_BIN=/path/to/llama.cpp/build/bin] [ROUNDS=3] [CPU_MATMUL=fp32|int8] [DEPTH=4096] \
#       bench/run_cpu_bench.sh [MODEL] [THREADS]
# LLAMA_BIN is a directory holding llama-bench and llama-batched-bench from a llama.cpp build of
# your own, outside this repository (nothing of llama.cpp is built or kept here); without it only
# Braid runs. Braid runs its default arithmetic unless CPU_MATMUL says otherwise.
# Each round runs every measurement of both engines back to back (braid, then llama.cpp), so a slow
# spell on a shared machine hits both alike; the table gives each engine's best round (noise only
# ever slows a run down) and the ratio of the bests. Raw rows go to $OUT; with APPEND=1 the table
# is appended to bench/RESULTS.md with the command, machine and date.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${2:-2}
rounds=${ROUNDS:-3}
depth=${DEPTH:-4096}
out=${OUT:-/tmp/braid-cpu-bench}
math_flag=${CPU_MATMUL:+--cpu-matmul $CPU_MATMUL}
llama=${LLAMA_BIN:-}
mkdir -p "$out"
rm -f "$out"/*.jsonl "$out"/*.txt
for c in 16 64; do bench/batch_workload.py requests "$c" > "$out/req_$c.jsonl"; done
echo "[bench] $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2

braid_batch() { # concurrency → appends {"concurrency", "decode_tok_s", "prompt_tokens"} to braid_batch.jsonl
  build/braid batch --model "$model" --input "$out/req_$1.jsonl" --output "$out/res_$1.jsonl" --max-running "$1" \
    --threads "$threads" $math_flag --max-batch-tokens 2048 --kv-blocks 1024 --cache off 2> "$out/log_$1.txt" > /dev/null
  printf '{"concurrency":%s,"decode_tok_s":%s,"prompt_tokens":%s}\n' "$1" \
    "$(bench/batch_workload.py decode-rate "$out/res_$1.jsonl")" "$(bench/batch_workload.py mean-prompt "$out/res_$1.jsonl")" \
    >> "$out/braid_batch.jsonl"
}

for r in $(seq "$rounds"); do
  echo "[bench] round $r/$rounds: braid" >&2
  build/bench_cpu --model "$model" --threads "$threads" $math_flag --prompt-tokens 512 --decode-tokens 128 --repeats 1 >> "$out/braid.jsonl"
  build/bench_cpu --model "$model" --threads "$threads" $math_flag --prompt-tokens "$depth" --decode-tokens 128 --repeats 1 >> "$out/braid_depth.jsonl"
  braid_batch 16
  braid_batch 64
  if [ -n "$llama" ]; then
    echo "[bench] round $r/$rounds: llama.cpp" >&2
    "$llama/llama-bench" -m "$model" -t "$threads" -p 512 -n 128 -r 1 -o jsonl 2>/dev/null >> "$out/llama.jsonl"
    "$llama/llama-bench" -m "$model" -t "$threads" -p 0 -n 128 -d "$depth" -r 1 -o jsonl 2>/dev/null >> "$out/llama_depth.jsonl"
    npp=$(bench/batch_workload.py mean-prompt "$out/res_16.jsonl")
    "$llama/llama-batched-bench" -m "$model" -t "$threads" -c $((64 * (npp + 64) + 64)) -b 2048 -ub 512 \
      -npp "$npp" -ntg 64 -npl 16,64 --output-format jsonl 2>/dev/null | grep '^{' >> "$out/llama_batch.jsonl" || true
  fi
done

table=$(python3 - "$out" "$depth" <<'PY'
import json, os, sys
out, depth = sys.argv[1], int(sys.argv[2])
def rows(name):
    path = os.path.join(out, name)
    return [json.loads(l) for l in open(path) if l.strip()] if os.path.exists(path) else []
braid, braid_depth, braid_batch = rows("braid.jsonl"), rows("braid_depth.jsonl"), rows("braid_batch.jsonl")
llama, llama_depth, llama_batch = rows("llama.jsonl"), rows("llama_depth.jsonl"), rows("llama_batch.jsonl")
best = lambda xs: max(xs) if xs else None
lines = [
    ("pp512 tok/s", best([r["pp_tok_s"] for r in braid]), best([r["avg_ts"] for r in llama if r["n_prompt"] > 0]), 1.75),
    ("tg128 tok/s", best([r["tg_tok_s"] for r in braid]), best([r["avg_ts"] for r in llama if r["n_gen"] > 0]), 1.25),
    (f"tg128 after {depth} tokens, tok/s", best([r["tg_after_pp_tok_s"] for r in braid_depth]),
     best([r["avg_ts"] for r in llama_depth if r["n_gen"] > 0]), 1.25),
]
for c in (16, 64):
    lines.append((f"decode phase, {c} sequences, tok/s", best([r["decode_tok_s"] for r in braid_batch if r["concurrency"] == c]),
                  best([r["speed_tg"] for r in llama_batch if r["pl"] == c]), 2.0))
fmt = lambda v: f"{v:.1f}" if v is not None else "–"
print("| measurement | Braid | llama.cpp | Braid / llama.cpp | target |")
print("| --- | ---: | ---: | ---: | ---: |")
for name, b, l, target in lines:
    ratio = f"{b / l:.2f}" if b and l else "–"
    print(f"| {name} | {fmt(b)} | {fmt(l)} | {ratio} | ≥ {target} |")
PY
)
echo "$table"
if [ "${APPEND:-0}" = 1 ]; then
  {
    echo
    echo "### CPU side by side, $(date -u +%Y-%m-%d) ($(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $threads threads, best of $rounds interleaved rounds)"
    echo
    echo "\`ROUNDS=$rounds DEPTH=$depth ${CPU_MATMUL:+CPU_MATMUL=$CPU_MATMUL }LLAMA_BIN=… bench/run_cpu_bench.sh $model $threads\`"
    echo
    echo "$table"
  } >> bench/RESULTS.md
fi
