#!/usr/bin/env bash
# Engine throughput on the CPU: C concurrent sequences, each a distinct ~130-token prompt decoding
# 64 tokens (ignore_eos; bench/batch_workload.py), through `braid batch`; then a shared-prefix
# workload with the radix cache off and on.
#   [CPU_MATMUL=int8|fp32] [ROUNDS=N] bench/run_batch_bench.sh [MODEL] [CONCURRENCY...]
# Without CPU_MATMUL, braid batch runs its default arithmetic.
# The concurrency levels run interleaved, ROUNDS times (default 5), so a slow spell on a shared
# machine hits every level alike; the table gives medians, the decode-phase range, and the ratio of
# medians to one sequence. Per-run numbers go to $OUT/runs.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
shift || true
levels=${*:-1 4 16 64}
math_flag=${CPU_MATMUL:+--cpu-matmul $CPU_MATMUL}   # the CPU decode arithmetic measured (default: braid's)
rounds=${ROUNDS:-5}
out=${OUT:-/tmp/braid-batch-bench}
mkdir -p "$out"
echo "[bench] $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "[bench] arithmetic ${CPU_MATMUL:-default}, $rounds rounds over concurrency $levels" >&2

for c in $levels; do bench/batch_workload.py requests "$c" > "$out/req_$c.jsonl"; done

printf 'round\tconcurrency\tend_to_end_tok_s\tdecode_tok_s\n' > "$out/runs.tsv"
for round in $(seq 1 "$rounds"); do
  for c in $levels; do
    build/braid batch --model "$model" --input "$out/req_$c.jsonl" --output "$out/res_$c.jsonl" --max-running "$c" \
      $math_flag --max-batch-tokens 2048 --kv-blocks 1024 --cache off 2> "$out/log_$c.txt" > /dev/null
    tps=$(grep -oE '[0-9.]+ generated tok/s' "$out/log_$c.txt" | cut -d' ' -f1)
    dec=$(bench/batch_workload.py decode-rate "$out/res_$c.jsonl")
    printf '%s\t%s\t%s\t%s\n' "$round" "$c" "$tps" "$dec" >> "$out/runs.tsv"
    echo "[bench] round $round/$rounds, $c sequences: decode $dec tok/s" >&2
  done
done

python3 - "$out/runs.tsv" <<'PY'
import csv, statistics, sys
runs = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
levels = sorted({int(r["concurrency"]) for r in runs})
def col(c, key):
    return [float(r[key]) for r in runs if int(r["concurrency"]) == c]
base = statistics.median(col(levels[0], "decode_tok_s"))
print("| concurrent sequences | end-to-end generated tok/s | decode-phase tok/s (median) | decode range | decode ratio to %d |" % levels[0])
print("| ---: | ---: | ---: | ---: | ---: |")
for c in levels:
    dec = col(c, "decode_tok_s")
    med = statistics.median(dec)
    print(f"| {c} | {statistics.median(col(c, 'end_to_end_tok_s')):.1f} | {med:.1f} | {min(dec):.0f}–{max(dec):.0f} | {med / base:.2f} |")
PY

python3 - > "$out/shared.jsonl" <<'PY'
pre = " ".join(f"rule{k}: always validate input {k} before use." for k in range(40))
for i in range(16):
    print('{"id":"p%d","prompt":"%s Task %d: summarize.","max_tokens":16,"ignore_eos":true}' % (i, pre, i))
PY
for cache in off radix; do
  build/braid batch --model "$model" --input "$out/shared.jsonl" --output "$out/shared_$cache.jsonl" --max-running 4 \
    --cache "$cache" 2> "$out/shared_$cache.txt" > /dev/null
  echo "shared prefix, cache $cache: $(grep -oE 'in [0-9.]+ s' "$out/shared_$cache.txt" | head -1), $(awk '/prompt tokens [0-9]+: device hits/ {gsub(/[:,]/, ""); printf "hit rate %.1f%% (device %d + host %d of %d prompt tokens)", 100 * ($7 + $10) / $4, $7, $10, $4}' "$out/shared_$cache.txt")"
done
