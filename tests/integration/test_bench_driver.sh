#!/usr/bin/env bash
# Integration test of the load driver braid-bench against a real 1-instance cluster (mpirun, HTTP):
#   tests/integration/test_bench_driver.sh BRAID_BINARY BRAID_BENCH_BINARY MODEL
# 1. every command answers --help; bad arguments exit 2;
# 2. replay: 4 requests (completions and chat) -> 4 results with status 200 whose texts equal
#    braid batch's on the same input (greedy; the CPU engine is batch-invariant); --result-json in
#    vLLM's shape with TTFT from each request's own send; compare of the cluster against itself;
# 3. run: the codegen workload, 3 workflows, 2 at a time, small scale -> requests.jsonl,
#    workflows.jsonl, summary.json and trace.jsonl that agree with each other; the server's own
#    trace (--trace-out) records the 3 workflow ends the driver announced; braid sim replays the
#    driver's trace; braid-bench plot writes a PNG;
# 4. SIGTERM stops the cluster cleanly.
# BRAID_TEST_PORT_RANGE=LO-HI picks the server's port in that range (default: any free port).
set -uo pipefail
braid=$(realpath "$1")
bench=$(realpath "$2")
model=$(realpath "$3")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
failures=0
launcher_pid=""
trap 'cleanup' EXIT

cleanup() {
  # The launcher runs in its own session (setsid), so its group id is its pid: this ends mpirun and
  # its ranks, and nothing else.
  [ -n "$launcher_pid" ] && kill -KILL -- "-$launcher_pid" 2> /dev/null
  rm -rf "$work"
}
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }

free_port() {
  python3 - "${BRAID_TEST_PORT_RANGE:-}" <<'PY'
import random, socket, sys
spec = sys.argv[1]
candidates = [0]
if spec:
    lo, hi = map(int, spec.split("-"))
    candidates = random.sample(range(lo, hi + 1), hi - lo + 1)
for port in candidates:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    print(s.getsockname()[1])
    break
PY
}

port=$(free_port)
[ -n "$port" ] || { echo "FAIL no free port"; exit 1; }
url=http://127.0.0.1:$port

# ---------------------------------------------------------------- 1. help and usage errors
for cmd in replay run gen plot compare; do
  check "braid-bench $cmd --help exits 0" bash -c "'$bench' $cmd --help > /dev/null"
done
check "braid-bench --help lists the commands" bash -c "'$bench' --help | grep -q replay && '$bench' --help | grep -q plot"
"$bench" frobnicate > /dev/null 2>&1; check "an unknown command exits 2" [ $? = 2 ]
"$bench" replay --input x > /dev/null 2>&1; check "replay without --out exits 2" [ $? = 2 ]
"$bench" run --workload no-such-workload > /dev/null 2>&1; check "run with an unknown workload exits 2" [ $? = 2 ]
"$bench" run --workload codegen --concurrency 0 > /dev/null 2>&1; check "run --concurrency 0 exits 2" [ $? = 2 ]

# ---------------------------------------------------------------- the cluster
BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --instances 1 --tp 1 --port "$port" \
  --trace-out "$work/server_trace.jsonl" > "$work/server.out" 2> "$work/server.err" &
launcher_pid=$!
ready=0
for _ in $(seq 1 240); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && { ready=1; break; }
  kill -0 "$launcher_pid" 2> /dev/null || break
  sleep 0.5
done
if [ "$ready" != 1 ]; then fail "cluster never became ready"; cat "$work/server.err"; exit 1; fi
ok "cluster ready on port $port"

# ---------------------------------------------------------------- 2. replay
cat > "$work/requests.jsonl" <<'JSONL'
{"id": "capital", "prompt": "The capital of France is", "max_tokens": 16}
{"id": "fib", "prompt": "def fibonacci(n):", "max_tokens": 16}
{"id": "chat", "messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 16}
{"id": "story", "prompt": "Once upon a time", "max_tokens": 16, "agent": "writer", "workflow_id": "replay-wf"}
JSONL
"$bench" replay --input "$work/requests.jsonl" --url "$url" --concurrency 4 --out "$work/replay.jsonl" \
  --result-json "$work/replay_vllm.json" --slo-ttft-ms 600000 2> "$work/replay.err"
check "replay exits 0" [ $? = 0 ]
check "replay prints a throughput and TTFT summary" grep -q "req/s.*output tok/s" "$work/replay.err"
check "replay prints per-request TTFT/ITL/E2EL percentiles" grep -q "TTFT mean .*ITL mean .*E2EL mean" "$work/replay.err"
check "replay --result-json: vLLM's shape, TTFT from each request's own send" python3 - "$work/replay_vllm.json" "$work/replay.jsonl" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rows = [json.loads(l) for l in open(sys.argv[2])]
assert r["completed"] == 4 and r["failed"] == 0 and r["request_goodput"] == r["request_throughput"], r
for own, row in zip(r["ttfts"], rows):
    assert abs(own * 1000 - (row["ttft_ms"] - row["sent_ms"])) < 1.0, (own, row)
assert r["total_output_tokens"] == sum(row["completion_tokens"] for row in rows) and len(r["itls"]) == 4
PY
"$braid" batch --model "$model" --input "$work/requests.jsonl" --output "$work/batch.jsonl" 2> "$work/batch.err"
check "braid batch on the same input exits 0" [ $? = 0 ]
check "replay: 4 results, all status 200, texts equal braid batch's" python3 - "$work/replay.jsonl" "$work/batch.jsonl" <<'PY'
import json, sys
replay = [json.loads(l) for l in open(sys.argv[1])]
batch = [json.loads(l) for l in open(sys.argv[2])]
assert len(replay) == 4, f"{len(replay)} results"
for r, b in zip(replay, batch):
    assert r["id"] == b["id"], (r["id"], b["id"])
    assert r["status"] == 200, r
    assert r["text"] == b["text"], (r["id"], r["text"], b["text"])
    assert r["completion_tokens"] == b["completion_tokens"] and r["prompt_tokens"] == b["prompt_tokens"], (r, b)
    assert 0 < r["ttft_ms"] <= r["latency_ms"], r
PY

"$bench" compare --input "$work/requests.jsonl" --rounds 2 --concurrency 2 --result-json "$work/compare.json" "$url" "$url/v1" \
  > "$work/compare.out" 2> "$work/compare.err"
check "compare against the cluster twice exits 0" [ $? = 0 ]
check "compare: a ratio table and the cached-token granularity note" python3 - "$work/compare.out" "$work/compare.json" <<'PY'
import json, sys
out = open(sys.argv[1]).read()
assert "output_throughput" in out and "whole KV blocks" in out, out
r = json.load(open(sys.argv[2]))
assert all(len(s["rounds"]) == 2 and s["rounds"][0]["failed"] == 0 for s in r["servers"]), r["servers"]
assert r["ratios"]["output_throughput"][1]["median"] > 0
PY

# ---------------------------------------------------------------- 3. run
run_dir=$work/run-codegen
"$bench" run --workload codegen --url "$url" --workflows 3 --concurrency 2 --scale 0.2 --max-tokens-cap 24 --seed 7 \
  --model "$model" --out "$run_dir" 2> "$work/run.err"
status=$?
check "run exits 0 (got $status)" [ "$status" = 0 ]
[ "$status" = 0 ] || tail -20 "$work/run.err"
check "run prints the summary table" grep -q "token-level hit rate" "$work/run.err"
for f in requests.jsonl workflows.jsonl summary.json trace.jsonl; do check "run wrote $f" [ -s "$run_dir/$f" ]; done
check "run outputs agree (requests, workflows, summary, trace)" python3 - "$run_dir" <<'PY'
import json, sys
d = sys.argv[1]
reqs = [json.loads(l) for l in open(f"{d}/requests.jsonl")]
wfs = [json.loads(l) for l in open(f"{d}/workflows.jsonl")]
summary = json.load(open(f"{d}/summary.json"))
trace = [json.loads(l) for l in open(f"{d}/trace.jsonl")]
trace_reqs = [t for t in trace if t["type"] == "request"]
trace_ends = [t for t in trace if t["type"] == "workflow_end"]
assert reqs and all(r["status"] == 200 for r in reqs), "a request failed"
assert len(wfs) == 3 == summary["workflows"], (len(wfs), summary["workflows"])
assert summary["requests"] == len(reqs) == len(trace_reqs), (summary["requests"], len(reqs), len(trace_reqs))
assert summary["errors"] == 0 and summary["token_mismatches"] == 0 and summary["workflow_end_errors"] == 0, summary
assert sum(r["prompt_tokens"] for r in reqs) == sum(t["prompt_tokens"] for t in trace_reqs) == summary["prompt_tokens"]
assert sum(r["cached_tokens"] for r in reqs) == summary["cached_tokens"]
assert sorted(t["workflow"] for t in trace_ends) == sorted(w["workflow"] for w in wfs), (trace_ends, wfs)
assert {r["workflow"] for r in reqs} == {w["workflow"] for w in wfs}
assert sum(w["requests"] for w in wfs) == len(reqs)
assert all(r["completion_tokens"] <= 24 for r in reqs), "--max-tokens-cap not applied"
assert 0 <= summary["hit_rate"] <= 1 and summary["generated_tok_s"] > 0
PY
wf_ids=$(python3 -c 'import json, sys; print(" ".join(sorted(json.loads(l)["workflow"] for l in open(sys.argv[1]))))' "$run_dir/workflows.jsonl")

sim_json=$("$braid" sim --trace "$run_dir/trace.jsonl" --kv-tokens 100000 --json 2> "$work/sim.err" | tail -1)
check "braid sim replays the run's trace" python3 - "$sim_json" "$run_dir/summary.json" <<'PY'
import json, sys
sim, summary = json.loads(sys.argv[1]), json.load(open(sys.argv[2]))
assert sim["requests"] == summary["requests"] and sim["workflow_ends"] == 3, sim
assert sim["prompt_tokens"] == summary["prompt_tokens"], (sim["prompt_tokens"], summary["prompt_tokens"])
PY

"$bench" plot "$run_dir" "$run_dir/" --out "$work/chart.png" 2> "$work/plot.err"
check "plot exits 0" [ $? = 0 ]
check "plot wrote a non-empty PNG" python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); assert len(d) > 1000 and d[:8] == b"\x89PNG\r\n\x1a\n"' "$work/chart.png"

# ---------------------------------------------------------------- 4. stop; the server's trace
kill -TERM "$launcher_pid"
wait "$launcher_pid"; status=$?
launcher_pid=""
check "SIGTERM stops the cluster with status 0 (got $status)" [ "$status" = 0 ]
check "the server recorded the 3 workflow ends the driver announced" python3 - "$work/server_trace.jsonl" "$wf_ids" <<'PY'
import json, sys
ends = sorted(json.loads(l)["workflow"] for l in open(sys.argv[1]) if '"workflow_end"' in l)
assert ends == sorted(sys.argv[2].split()), (ends, sys.argv[2])
PY

if [ "$failures" -gt 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all bench driver checks passed"
