#!/usr/bin/env bash
# Braid against llama.cpp's llama-server on the agent workloads, side by side, same GGUF, same
# threads, the same client (braid-bench), in interleaved rounds.
#   LLAMA_SERVER=/path/to/llama-server bench/llama_server_side_by_side.sh [OUT_DIR]
# llama-server is built outside this repository (e.g. from the llama-cpp-python sdist's
# vendor/llama.cpp: cmake -DGGML_NATIVE=ON -DLLAMA_CURL=OFF, target llama-server); nothing of it is
# kept here.
# Settings (environment): BRAID_BIN (build/braid), BENCH (build/braid-bench), MODEL
# (models/SmolLM2-135M-Instruct.Q4_1.gguf), THREADS (2), ROUNDS (3), WORKLOADS ("codegen factcheck
# pipeline"), WORKFLOWS (4), CONCURRENCY (4: workflows at once; llama-server gets as many parallel
# slots, -np, times FANOUT_SLOTS), SCALE (1), MAX_TOKENS_CAP (64), CTX_PER_SLOT (8192),
# CACHE_REUSE (256: llama-server's --cache-reuse chunk, as a user enabling prompt-cache reuse sets
# it), COMPARE (1: also `braid-bench compare` over the first workload's calls as independent
# requests, each with max_tokens 1 as `braid-bench gen --batch-out` writes them: prefill and TTFT).
# Both servers stay up for the whole run but only one is driven at a time: round r runs every
# workload against server r mod 2 first, then the other (seed r for both, so each round's workflows
# are new to both caches). Per run: braid-bench's summary.json and the requests in `vllm bench
# serve`'s JSON shape; at the end a table of per-server medians and Braid / llama-server ratios
# (median [min, max] over the rounds), written to OUT_DIR/side_by_side.md.
# Exit status: 0; 1 when a server did not start or any request failed on either server.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
: "${LLAMA_SERVER:?set LLAMA_SERVER to a llama-server binary built outside the repository}"
braid=${BRAID_BIN:-$root/build/braid}
bench=${BENCH:-$root/build/braid-bench}
model=$(realpath "${MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}")
threads=${THREADS:-2}
rounds=${ROUNDS:-3}
workloads=${WORKLOADS:-codegen factcheck pipeline}
workflows=${WORKFLOWS:-4}
concurrency=${CONCURRENCY:-4}
fanout_slots=${FANOUT_SLOTS:-1}
scale=${SCALE:-1}
max_tokens_cap=${MAX_TOKENS_CAP:-64}
ctx_per_slot=${CTX_PER_SLOT:-8192}
cache_reuse=${CACHE_REUSE:-256}
do_compare=${COMPARE:-1}
out=${1:-$root/runs/llama-side-by-side-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$out"
for f in "$braid" "$bench" "$LLAMA_SERVER" "$model"; do [ -e "$f" ] || { echo "missing: $f" >&2; exit 1; }; done

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
braid_port=$(free_port)
llama_port=$(free_port)
braid_url=http://127.0.0.1:$braid_port
llama_url=http://127.0.0.1:$llama_port
braid_pid=""
llama_pid=""
trap '[ -n "$braid_pid" ] && kill -KILL -- -"$braid_pid" 2> /dev/null; [ -n "$llama_pid" ] && kill -KILL -- -"$llama_pid" 2> /dev/null; true' EXIT

# wait_ready URL NAME PID: until /health answers 200 (10 min at most).
wait_ready() {
  for _ in $(seq 1 1200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1/health")" = 200 ] && return 0
    kill -0 "$3" 2> /dev/null || break
    sleep 0.5
  done
  echo "$2 did not get ready (see $out/$2.err)" >&2
  exit 1
}

slots=$((concurrency * fanout_slots))
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
  echo "load at start: $(uptime)"
  echo "braid: $braid ($(cd "$root" && git rev-parse --short HEAD 2> /dev/null || echo '?'))"
  echo "llama-server: $LLAMA_SERVER ($("$LLAMA_SERVER" --version 2>&1 | grep -m1 -i version || true))"
  echo "model: $model; threads $threads; rounds $rounds; workloads $workloads; $workflows workflows," \
    "concurrency $concurrency, scale $scale, max_tokens_cap $max_tokens_cap; llama-server -np $slots" \
    "-c $((slots * ctx_per_slot)) --cache-reuse $cache_reuse"
} | tee "$out/setup.txt"

BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$braid_port" --instances 1 --tp 1 \
  --threads "$threads" > "$out/braid.out" 2> "$out/braid.err" &
braid_pid=$!
setsid "$LLAMA_SERVER" -m "$model" --host 127.0.0.1 --port "$llama_port" -t "$threads" -tb "$threads" \
  -np "$slots" -c "$((slots * ctx_per_slot))" --cache-reuse "$cache_reuse" > "$out/llama.out" 2> "$out/llama.err" &
llama_pid=$!
wait_ready "$braid_url" braid "$braid_pid"
wait_ready "$llama_url" llama "$llama_pid"

# run_one SERVER URL WORKLOAD ROUND: one braid-bench run, results in $out/rROUND/WORKLOAD/SERVER/.
run_one() {
  local dir=$out/r$4/$3/$1
  mkdir -p "$dir"
  echo "[side-by-side] round $4, $3 against $1" >&2
  "$bench" run --workload "$3" --url "$2" --workflows "$workflows" --concurrency "$concurrency" --seed "$4" \
    --scale "$scale" --max-tokens-cap "$max_tokens_cap" --no-trace --out "$dir" --result-json "$dir/vllm.json" \
    2> "$dir/run.log" || echo "[side-by-side] round $4, $3 against $1: braid-bench run exited $?" >&2
}

for r in $(seq 1 "$rounds"); do
  order="braid llama"
  [ $((r % 2)) = 0 ] && order="llama braid"
  for w in $workloads; do
    for s in $order; do
      if [ "$s" = braid ]; then run_one braid "$braid_url" "$w" "$r"; else run_one llama "$llama_url" "$w" "$r"; fi
    done
  done
done

if [ "$do_compare" = 1 ]; then
  first=${workloads%% *}
  "$bench" gen --workload "$first" --workflows "$workflows" --scale "$scale" --model "$model" \
    --out "$out/compare_trace.jsonl" --batch-out "$out/compare_input.jsonl" > "$out/gen.log" 2>&1
  "$bench" compare --input "$out/compare_input.jsonl" --rounds "$rounds" --concurrency "$concurrency" \
    --names Braid,llama-server --result-json "$out/compare.json" "$braid_url" "$llama_url" \
    > "$out/compare.txt" 2> "$out/compare.log" || echo "[side-by-side] compare exited $?" >&2
  cat "$out/compare.txt"
fi
echo "load at end: $(uptime)" | tee -a "$out/setup.txt"

python3 - "$out" "$rounds" $workloads <<'PY' | tee "$out/side_by_side.md"
import json, os, statistics, sys
out, rounds, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
figures = [  # (label, getter, lower is better)
    ("failed requests", lambda s: s["errors"], True),
    ("connection retries", lambda s: s["metrics"]["connection_retries"], True),
    ("mean workflow latency s", lambda s: s["mean_workflow_latency_s"], True),
    ("p90 workflow latency s", lambda s: s["p90_workflow_latency_s"], True),
    ("TTFT p50 ms", lambda s: s["metrics"]["ttft_ms"]["p50"], True),
    ("TTFT p99 ms", lambda s: s["metrics"]["ttft_ms"]["p99"], True),
    ("ITL mean ms", lambda s: s["metrics"]["itl_ms"]["mean"], True),
    ("E2E p50 ms", lambda s: s["metrics"]["e2el_ms"]["p50"], True),
    ("E2E p99 ms", lambda s: s["metrics"]["e2el_ms"]["p99"], True),
    ("output tok/s", lambda s: s["metrics"]["output_throughput"], False),
    ("requests", lambda s: s["requests"], False),
    ("prompt tokens", lambda s: s["prompt_tokens"], False),
    ("cached prompt tokens*", lambda s: s["cached_tokens"], False),
]
failed = 0
for w in workloads:
    print(f"\n### {w}\n")
    print("| figure | Braid (median) | llama-server (median) | Braid / llama-server: median [min, max] |")
    print("| --- | ---: | ---: | ---: |")
    runs = {}
    for r in range(1, rounds + 1):
        for s in ("braid", "llama"):
            p = os.path.join(out, f"r{r}", w, s, "summary.json")
            runs.setdefault(s, []).append(json.load(open(p)) if os.path.exists(p) else None)
    for s in ("braid", "llama"):
        failed += sum(1 for x in runs[s] if x is None) + sum(x["errors"] for x in runs[s] if x)
    for label, get, _ in figures:
        b = [get(x) for x in runs["braid"] if x]
        l = [get(x) for x in runs["llama"] if x]
        ratios = [get(x) / get(y) for x, y in zip(runs["braid"], runs["llama"]) if x and y and get(y)]
        med = lambda v: (lambda m: f"{m:.0f}" if abs(m) >= 100 else f"{m:.3g}")(statistics.median(v)) if v else "-"
        rat = f"{statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]" if ratios else "-"
        print(f"| {label} | {med(b)} | {med(l)} | {rat} |")
print("\n*Cached tokens differ in granularity: Braid counts whole 16-token KV blocks matched at admission;"
      " llama-server counts the tokens its slot reused (any length, plus --cache-reuse chunks).")
print(f"\nfailed requests or missing runs, both servers: {failed}")
sys.exit(1 if failed else 0)
PY
