#!/usr/bin/env bash
# braid-bench as a neutral client, against a small in-test OpenAI-compatible server
# (fake_openai_server.py, 127.0.0.1, a port from free_port.py) that is awkward about keep-alive:
#   tests/integration/test_bench_client.sh BRAID_BENCH_BINARY
# 1. keep-alive: for every way of closing (keep, after 3 requests, right after each response, after
#    20 ms idle, dropping the next request of a connection unanswered, "Connection: close") and every
#    framing (chunked, Content-Length, end of connection), every request succeeds (0 client failures),
#    each is answered exactly once, and every request the server dropped unanswered was resent;
# 2. a server that dies mid-answer: the requests fail and none is sent twice;
# 3. run against a server without workflow ends (404, 405): warned about once, one POST, exit 0;
# 4. per-request timing: TTFT counts from each request's own send, ITL and E2EL present, goodput
#    under SLOs; --result-json has the fields `vllm bench serve` writes;
# 5. compare: two servers (one slower), interleaved rounds, ratios with spread, plot, JSON;
# 6. usage errors exit 2.
set -uo pipefail
bench=$(realpath "$1")
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
failures=0
server_pids=()
trap 'cleanup' EXIT

cleanup() {
  for pid in "${server_pids[@]}"; do kill "$pid" 2> /dev/null; done
  rm -rf "$work"
}
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }

# start_server NAME ARGS...: starts a fake server, waits until it listens; sets $port.
start_server() {
  local name=$1; shift
  port=$(python3 "$here/free_port.py")
  rm -f "$work/$name.ready" "$work/$name.stats"
  python3 "$here/fake_openai_server.py" --port "$port" --stats "$work/$name.stats" --ready "$work/$name.ready" "$@" \
    2> "$work/$name.server.log" &
  server_pids+=($!)
  last_server=$!
  for _ in $(seq 100); do [ -f "$work/$name.ready" ] && return 0; sleep 0.05; done
  echo "FAIL fake server $name did not start: $(cat "$work/$name.server.log")"; exit 1
}
# stop_server: stops the last server started and waits for its counters.
stop_server() {
  kill "$last_server" 2> /dev/null
  wait "$last_server" 2> /dev/null
}

for i in $(seq 1 12); do
  if [ $((i % 3)) -eq 0 ]; then echo "{\"id\":\"r$i\",\"messages\":[{\"role\":\"user\",\"content\":\"hello $i\"}],\"max_tokens\":6}"
  else echo "{\"id\":\"r$i\",\"prompt\":\"one two three $i\",\"max_tokens\":6}"; fi
done > "$work/requests.jsonl"

# ---------------------------------------------------------------- 1. keep-alive behaviours
for mode in keep close-after-3 close-after idle-close drop-next connection-close; do
  for framing in chunked length eof; do
    tag="$mode/$framing"
    start_server ka --mode "$mode" --framing "$framing"
    "$bench" replay --input "$work/requests.jsonl" --out "$work/ka.jsonl" --url "http://127.0.0.1:$port" --concurrency 2 \
      --repeat 2 --result-json "$work/ka.json" 2> "$work/ka.err"
    rc=$?
    stop_server
    check "$tag: replay exits 0" test "$rc" -eq 0
    check "$tag: 24 requests, 0 client failures, each answered once, drops resent" python3 - "$work" "$mode" <<'PY'
import json, re, sys
w = sys.argv[1]
err = open(w + "/ka.err").read()
failed = sum(int(n) for n in re.findall(r"(\d+) failed in", err))
completed = sum(int(n) for n in re.findall(r"(\d+) completed, \d+ failed in", err))
resent = sum(int(n) for n in re.findall(r"(\d+) connection retries", err))
stats = json.load(open(w + "/ka.stats"))
rows = [json.loads(l) for l in open(w + "/ka.jsonl")]
res = json.load(open(w + "/ka.json"))
assert completed == 24 and failed == 0, err
assert all(r["status"] == 200 and "error" not in r and r["completion_tokens"] == 5 for r in rows), [r for r in rows if "error" in r][:2]
assert res["completed"] == 12 and res["failed"] == 0 and all(e == "" for e in res["errors"]), res
mode = sys.argv[2]
# Each request answered exactly once (none processed twice); a dropped one was resent. A server that
# closes right after answering can also lose a request in the kernel (sent on a connection it had
# just closed): resent then, though the server never saw it.
assert stats["answered"] == 24 and stats["requests"] == 24 + stats["dropped"], stats
assert stats["dropped"] <= resent <= 24, (resent, stats)
if mode in ("keep", "connection-close"):
    assert resent == 0, (resent, stats)
PY
  done
done
# drop-next, 30 requests on one client: every reused connection dies under its request. The client
# before issue 38 failed 4 of these 30 with libcurl's "Connection died, tried 5 times before giving
# up" (its resend count runs over a handle's life); each must be resent once, fresh, and succeed.
for i in $(seq 1 30); do echo "{\"id\":\"d$i\",\"prompt\":\"drop $i\",\"max_tokens\":3}"; done > "$work/drop_in.jsonl"
start_server drop --mode drop-next
"$bench" replay --input "$work/drop_in.jsonl" --out "$work/drop.jsonl" --url "http://127.0.0.1:$port" 2> "$work/drop.err"
stop_server
check "drop-next: 30 of 30 succeed, each dropped request resent once on a fresh connection, counted" python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
stats = json.load(open(w + "/drop.stats"))
rows = [json.loads(l) for l in open(w + "/drop.jsonl")]
assert len(rows) == 30 and stats["dropped"] == 29, stats
assert sum(r["connection_retries"] for r in rows) == stats["dropped"], (stats, rows)
assert all(r["status"] == 200 and r["connection_retries"] <= 1 for r in rows)
PY

# ---------------------------------------------------------------- 2. never resent once an answer began
start_server partial --mode partial
"$bench" replay --input "$work/requests.jsonl" --out "$work/partial.jsonl" --url "http://127.0.0.1:$port" --concurrency 2 \
  2> "$work/partial.err"
stop_server
check "partial answers: every request fails, the server saw each exactly once, 0 resends" python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
stats = json.load(open(w + "/partial.stats"))
rows = [json.loads(l) for l in open(w + "/partial.jsonl")]
assert len(rows) == 12 and all("error" in r and r["connection_retries"] == 0 for r in rows), rows
assert stats["requests"] == 12 and stats["partial"] == 12, stats
PY

# ---------------------------------------------------------------- 3. workflow ends are optional
for status in 404 405; do
  start_server wf --mode close-after-3 --workflow-end "$status"
  "$bench" run --workload codegen --workflows 3 --concurrency 2 --scale 0.05 --no-trace --url "http://127.0.0.1:$port" \
    --out "$work/run$status" --slo-ttft-ms 60000 --slo-itl-ms 60000 --result-json "$work/run$status.json" 2> "$work/run$status.err"
  rc=$?
  stop_server
  check "run, workflow end answered $status: exit 0" test "$rc" -eq 0
  check "run, workflow end answered $status: warned once, one POST, no error counted" python3 - "$work" "$status" <<'PY'
import json, sys
w, status = sys.argv[1], sys.argv[2]
err = open(w + "/run%s.err" % status).read()
assert err.count("does not take workflow ends") == 1, err
stats = json.load(open(w + "/wf.stats"))
assert stats["workflow_ends"] == 1, stats
s = json.load(open(w + "/run%s/summary.json" % status))
assert s["workflow_end_errors"] == 0 and s["workflow_ends_supported"] is False and s["errors"] == 0, s
m = s["metrics"]
assert m["ttft_ms"]["p99"] >= m["ttft_ms"]["p50"] > 0 and m["e2el_ms"]["mean"] > 0 and m["request_goodput"] > 0, m
PY
done
check "run --result-json: vLLM's fields, one entry per request" python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
r = json.load(open(w + "/run404.json"))
n = len([l for l in open(w + "/run404/requests.jsonl")])
for k in ["duration", "completed", "failed", "total_input_tokens", "total_output_tokens", "request_throughput",
          "request_goodput", "output_throughput", "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls",
          "errors", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
          "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms"]:
    assert k in r, k
assert r["completed"] == n and len(r["ttfts"]) == n and len(r["itls"]) == n and len(r["output_lens"]) == n, r
assert r["request_goodput"] == r["request_throughput"], r
PY

# ---------------------------------------------------------------- 4. per-request timing, goodput
for i in 1 2 3 4 5; do echo "{\"id\":\"s$i\",\"prompt\":\"slow $i\",\"max_tokens\":4}"; done > "$work/slow.jsonl"
start_server slow --token-delay-ms 20 --tokens 4
"$bench" replay --input "$work/slow.jsonl" --out "$work/slow.out" --url "http://127.0.0.1:$port" --concurrency 1 \
  --slo-ttft-ms 10000 --slo-itl-ms 1 --result-json "$work/slow.json" 2> "$work/slow.err"
stop_server
check "replay: TTFT from each request's own send; ITLs per chunk; goodput under a strict ITL SLO is 0" python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
r = json.load(open(w + "/slow.json"))
rows = [json.loads(l) for l in open(w + "/slow.out")]
# One client: the 5th request is sent ~4 answers after the start; its own TTFT is one token delay.
assert rows[4]["sent_ms"] > 200, rows[4]
own = (rows[4]["ttft_ms"] - rows[4]["sent_ms"]) / 1000
assert abs(r["ttfts"][4] - own) < 0.005 and r["ttfts"][4] < 0.1, (r["ttfts"], own)
assert 15 < r["mean_ttft_ms"] < 100, r["mean_ttft_ms"]
assert all(len(x) == 3 for x in r["itls"]) and 15 < r["median_itl_ms"] < 100, r["itls"]
assert r["request_goodput"] == 0 and r["goodput_config"] == {"ttft": 10000.0, "tpot": 1.0}, r
PY
check "replay summary: TTFT/TPOT/ITL/E2EL percentiles and goodput" \
  grep -q "TTFT mean .* p99 .*ITL mean .*E2EL mean" "$work/slow.err"
check "replay summary: goodput line" grep -q "goodput 0.00 req/s (0 of 5" "$work/slow.err"

# ---------------------------------------------------------------- 5. compare
start_server fast --tokens 6
fast=$port
fast_pid=$last_server
start_server slower --tokens 6 --token-delay-ms 5 --mode close-after-3
slow=$port
"$bench" compare --input "$work/requests.jsonl" --rounds 3 --concurrency 2 --names fast,slow --plot "$work/compare.png" \
  --result-json "$work/compare.json" "http://127.0.0.1:$fast" "http://127.0.0.1:$slow" > "$work/compare.out" 2> "$work/compare.err"
rc=$?
stop_server
last_server=$fast_pid
stop_server
check "compare exits 0" test "$rc" -eq 0 || cat "$work/compare.err"
check "compare: a table of ratios with spread and the cached-token note" python3 - "$work" <<'PY'
import re, sys
out = open(sys.argv[1] + "/compare.out").read()
assert "request_throughput" in out and "mean_ttft_ms" in out and "mean_itl_ms" in out, out
line = [l for l in out.splitlines() if l.split()[:1] == ["slow"] and "[" in l]
assert line, out
m = re.search(r"mean_e2el_ms.*\n\s+\S+\s+[\d.]+\s+([\d.]+)\s+\[([\d.]+), ([\d.]+)\]", out)
assert m and float(m.group(1)) > 1.5 and float(m.group(2)) <= float(m.group(1)) <= float(m.group(3)), out
assert "granularity differs by server" in out and "whole KV blocks" in out, out
PY
check "compare: interleaved rounds (the second round starts with the second server)" \
  bash -c "grep -m3 '^\[compare round' '$work/compare.err' | sed -n 3p | grep -q 'round 2/3, slow'"
check "compare --result-json: 3 vLLM-shaped runs per server and the ratios" python3 - "$work" <<'PY'
import json, sys
r = json.load(open(sys.argv[1] + "/compare.json"))
assert [s["label"] for s in r["servers"]] == ["fast", "slow"], r["servers"]
assert all(len(s["rounds"]) == 3 and s["rounds"][0]["completed"] == 12 for s in r["servers"])
ratio = r["ratios"]["mean_e2el_ms"]
assert ratio[0]["median"] == 1 and ratio[1]["min"] <= ratio[1]["median"] <= ratio[1]["max"], ratio
assert "granularity" in r["cached_tokens_note"]
PY
if command -v gnuplot > /dev/null; then
  check "compare --plot writes a PNG" bash -c "head -c 8 '$work/compare.png' | od -An -c | grep -q 'P   N   G'"
else
  echo "skip compare --plot (no gnuplot)"
fi

# ---------------------------------------------------------------- 6. usage errors
check "compare with one server exits 2" bash -c "'$bench' compare --input '$work/requests.jsonl' http://127.0.0.1:1 2> /dev/null; test \$? -eq 2"
check "a bad SLO exits 2" bash -c "'$bench' replay --input x --out y --slo-ttft-ms abc 2> /dev/null; test \$? -eq 2"
check "compare --help exits 0" bash -c "'$bench' compare --help | grep -q interleaved"

echo "$failures failures"
[ "$failures" -eq 0 ]
