#!/usr/bin/env bash
# CPU microbenchmark, Braid side by side with llama.cpp on the same GGUF and thread count.
#   bench/run_cpu_bench.sh [MODEL] [THREADS]
# Set LLAMA_BENCH=/path/to/llama-bench (a llama.cpp build of your own, outside this repository) to
# include llama.cpp; rounds alternate between the two engines so machine noise hits both alike.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
threads=${2:-2}
rounds=${ROUNDS:-3}
out=${OUT:-/tmp/braid-cpu-bench}
mkdir -p "$out"
: > "$out/braid.jsonl"
: > "$out/llama.jsonl"
for r in $(seq "$rounds"); do
  echo "[bench] round $r/$rounds: braid" >&2
  build/bench_cpu --model "$model" --threads "$threads" --prompt-tokens 512 --decode-tokens 128 --repeats 1 >> "$out/braid.jsonl"
  if [ -n "${LLAMA_BENCH:-}" ]; then
    echo "[bench] round $r/$rounds: llama.cpp" >&2
    "$LLAMA_BENCH" -m "$model" -t "$threads" -p 512 -n 128 -r 1 -o jsonl 2>/dev/null >> "$out/llama.jsonl"
  fi
done
python3 - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
braid = [json.loads(l) for l in open(f"{out}/braid.jsonl") if l.strip()]
llama = [json.loads(l) for l in open(f"{out}/llama.jsonl") if l.strip()]
med = statistics.median
b_pp, b_tg = med(r["pp_tok_s"] for r in braid), med(r["tg_tok_s"] for r in braid)
b_tg512 = med(r["tg_after_pp_tok_s"] for r in braid)
print(f"| engine | pp512 tok/s | tg128 tok/s | tg128 after 512 tok/s |")
print(f"| --- | ---: | ---: | ---: |")
print(f"| braid | {b_pp:.1f} | {b_tg:.1f} | {b_tg512:.1f} |")
if llama:
    l_pp = med(r["avg_ts"] for r in llama if r["n_prompt"] > 0)
    l_tg = med(r["avg_ts"] for r in llama if r["n_gen"] > 0)
    print(f"| llama.cpp | {l_pp:.1f} | {l_tg:.1f} | |")
    print(f"| braid / llama.cpp | {b_pp / l_pp:.2f} | {b_tg / l_tg:.2f} | |")
PY
