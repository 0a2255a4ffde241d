#!/usr/bin/env bash
# Engine throughput on the CPU: C concurrent sequences, each a distinct 64-token prompt decoding
# 64 tokens (ignore_eos), through `braid batch`; then a shared-prefix workload with the radix cache
# on and off.   [CPU_MATMUL=int8|fp32] bench/run_batch_bench.sh [MODEL] [CONCURRENCY...]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
shift || true
levels=${*:-1 4 16 64}
math=${CPU_MATMUL:-int8}   # the CPU decode arithmetic measured (braid batch --cpu-matmul)
out=${OUT:-/tmp/braid-batch-bench}
mkdir -p "$out"
echo "| concurrent sequences | end-to-end generated tok/s | decode-phase tok/s | decode ratio to 1 |"
echo "| ---: | ---: | ---: | ---: |"
base=""
for c in $levels; do
  python3 - "$c" > "$out/req_$c.jsonl" <<'PY'
import sys
c = int(sys.argv[1])
for i in range(c):
    words = " ".join(f"item{(i * 31 + k) % 997}" for k in range(40))
    print('{"id":"s%d","prompt":"Inventory %d: %s. Continue the list:","max_tokens":64,"ignore_eos":true}' % (i, i, words))
PY
  build/braid batch --model "$model" --input "$out/req_$c.jsonl" --output "$out/res_$c.jsonl" --max-running "$c" --cpu-matmul "$math" \
    --max-batch-tokens 2048 --kv-blocks 1024 --cache off 2> "$out/log_$c.txt" > /dev/null
  tps=$(grep -oE '[0-9.]+ generated tok/s' "$out/log_$c.txt" | cut -d' ' -f1)
  # decode phase: tokens generated after every request has its first token, over that span
  dec=$(python3 - "$out/res_$c.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
start = max(r["ttft_ms"] for r in rows)
toks = 0.0
for r in rows:  # tokens of each request decoded after `start`, assuming an even pace
    span = r["latency_ms"] - r["ttft_ms"]
    done_after = max(0.0, r["latency_ms"] - max(start, r["ttft_ms"]))
    toks += (r["completion_tokens"] - 1) * (done_after / span if span > 0 else 0)
end = max(r["latency_ms"] for r in rows)
print(f"{toks / ((end - start) / 1e3):.1f}")
PY
)
  [ -n "$base" ] || base=$dec
  echo "| $c | $tps | $dec | $(python3 -c "print(f'{$dec / $base:.2f}')") |"
done
python3 - > "$out/shared.jsonl" <<'PY'
pre = " ".join(f"rule{k}: always validate input {k} before use." for k in range(40))
for i in range(16):
    print('{"id":"p%d","prompt":"%s Task %d: summarize.","max_tokens":16,"ignore_eos":true}' % (i, pre, i))
PY
for cache in off radix; do
  build/braid batch --model "$model" --input "$out/shared.jsonl" --output "$out/shared_$cache.jsonl" --max-running 4 \
    --cache "$cache" 2> "$out/shared_$cache.txt" > /dev/null
  echo "shared prefix, cache $cache: $(grep -oE 'in [0-9.]+ s' "$out/shared_$cache.txt" | head -1), $(grep -oE 'hit rate [0-9.]+%' "$out/shared_$cache.txt")"
done
