#!/usr/bin/env bash
# HTTP + MPI overhead of the cluster against the engine alone: for each concurrency C, C distinct
# ~120-token prompts decoding 64 tokens each (greedy, ignore_eos) are served once by `braid batch`
# (one process, no HTTP) and once by `braid-bench replay --concurrency C` against one running
# 1-instance cluster (launch/braid-local: HTTP coordinator + one MPI worker rank) with the same
# pool, batch budget and threads, cache off. The pairs run interleaved (batch, http, batch, http…)
# K times; the table reports medians and the HTTP/batch throughput ratio.
#
#   bench/http_overhead.sh [--model M] [--repeat K] [--levels "1 8 32"] [--port P] [--threads N]
#
# Env: BRAID (default build/braid), BRAID_BENCH (default build/braid-bench), OUT (work directory,
# default /tmp/braid-http-overhead).
set -euo pipefail
cd "$(dirname "$0")/.."
model=models/SmolLM2-135M-Instruct.Q4_1.gguf
repeat=3
levels="1 8 32"
port=8090
threads=2
cmdline="$0$(printf ' %q' "$@")"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --levels) levels=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "http_overhead.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
braid=${BRAID:-build/braid}
bench=${BRAID_BENCH:-build/braid-bench}
out=${OUT:-/tmp/braid-http-overhead}
for b in "$braid" "$bench"; do [ -x "$b" ] || { echo "http_overhead.sh: $b is not built" >&2; exit 1; }; done
mkdir -p "$out"
url=http://127.0.0.1:$port
max_level=$(printf '%s\n' $levels | sort -n | tail -1)
# The engine settings both sides share. The server's --max-running is the largest C: with exactly C
# requests in flight that is the same as braid batch's --max-running C.
engine_opts=(--max-batch-tokens 2048 --kv-blocks 1024 --cache off --threads "$threads")

echo "# HTTP + MPI overhead: braid batch vs braid-bench replay against launch/braid-local"
echo
echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
echo "- command: \`$cmdline\`"
echo "- machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "- model: $model; per request ~120 prompt tokens, 64 generated (ignore_eos, greedy); engine: ${engine_opts[*]}"
echo "- repeats: $repeat per level, interleaved; figures are medians"
echo

launcher_pid=""
stop_cluster() {
  [ -n "$launcher_pid" ] || return 0
  kill -TERM "$launcher_pid" 2> /dev/null || true
  wait "$launcher_pid" 2> /dev/null || true
  launcher_pid=""
}
trap stop_cluster EXIT

BRAID_BIN=$(realpath "$braid") launch/braid-local --model "$model" --instances 1 --tp 1 --port "$port" \
  --max-running "$max_level" "${engine_opts[@]}" > "$out/server.out" 2> "$out/server.err" &
launcher_pid=$!
for _ in $(seq 1 240); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && break
  kill -0 "$launcher_pid" 2> /dev/null || { echo "http_overhead.sh: the cluster exited; see $out/server.err" >&2; exit 1; }
  sleep 0.5
done
[ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] || { echo "http_overhead.sh: the cluster never became ready" >&2; exit 1; }

make_requests() {  # make_requests C FILE: C distinct ~120-token prompts (bench/run_batch_bench.sh's generator)
  python3 - "$1" > "$2" <<'PY'
import sys
c = int(sys.argv[1])
for i in range(c):
    words = " ".join(f"item{(i * 31 + k) % 997}" for k in range(28))
    print('{"id":"s%d","prompt":"Inventory %d: %s. Continue the list:","max_tokens":64,"ignore_eos":true,"temperature":0}' % (i, i, words))
PY
}

mean_ttft() { python3 -c 'import json, sys; t = [json.loads(l)["ttft_ms"] for l in open(sys.argv[1])]; print("%.1f" % (sum(t) / len(t)))' "$1"; }
tok_s() { grep -oE '[0-9.]+ generated tok/s' "$1" | head -1 | cut -d' ' -f1; }
median() { python3 -c 'import statistics, sys; print(f"{statistics.median(float(x) for x in sys.argv[1:]):.1f}")' "$@"; }
failed_requests() { python3 -c 'import json, sys; print(sum(1 for l in open(sys.argv[1]) if json.loads(l).get("error")))' "$1"; }

# Warm-up: one request through the cluster (first connection, first pages of the weights).
make_requests 1 "$out/warmup.jsonl"
"$bench" replay --input "$out/warmup.jsonl" --url "$url" --out "$out/warmup_res.jsonl" 2> /dev/null

echo "| C | batch tok/s | HTTP tok/s | HTTP / batch | batch mean TTFT ms | HTTP mean TTFT ms |"
echo "| ---: | ---: | ---: | ---: | ---: | ---: |"
for c in $levels; do
  make_requests "$c" "$out/req_$c.jsonl"
  b_tps=() h_tps=() b_ttft=() h_ttft=()
  for k in $(seq 1 "$repeat"); do
    "$braid" batch --model "$model" --input "$out/req_$c.jsonl" --output "$out/batch_${c}_$k.jsonl" --max-running "$c" \
      "${engine_opts[@]}" 2> "$out/batch_${c}_$k.log" > /dev/null
    b_tps+=("$(tok_s "$out/batch_${c}_$k.log")")
    b_ttft+=("$(mean_ttft "$out/batch_${c}_$k.jsonl")")
    "$bench" replay --input "$out/req_$c.jsonl" --url "$url" --concurrency "$c" --out "$out/http_${c}_$k.jsonl" \
      2> "$out/http_${c}_$k.log"
    bad=$(failed_requests "$out/http_${c}_$k.jsonl")
    [ "$bad" = 0 ] || { echo "http_overhead.sh: $bad HTTP requests failed at C=$c (see $out/http_${c}_$k.jsonl)" >&2; exit 1; }
    h_tps+=("$(tok_s "$out/http_${c}_$k.log")")
    h_ttft+=("$(mean_ttft "$out/http_${c}_$k.jsonl")")
  done
  bt=$(median "${b_tps[@]}") ht=$(median "${h_tps[@]}")
  ratio=$(python3 -c "print(f'{$ht / $bt:.2f}')")
  echo "| $c | $bt | $ht | $ratio | $(median "${b_ttft[@]}") | $(median "${h_ttft[@]}") |"
done
echo
echo "Raw results and logs: $out"
