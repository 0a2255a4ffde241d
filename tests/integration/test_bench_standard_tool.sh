#!/usr/bin/env bash
# A standard PyPI benchmarking tool that targets any OpenAI endpoint (guidellm), against a live
# 1-instance Braid cluster, offline: no hub, no tokenizer download (prompts from a local JSON file,
# token counts from the server's usage).
#   tests/integration/test_bench_standard_tool.sh BRAID_BINARY MODEL
# guidellm is found as $BRAID_GUIDELLM, else `guidellm` on PATH (pip install guidellm); without it
# the test says so and exits 77 (ctest: skipped).
# 1. guidellm's synchronous profile: 4 of 4 requests succeed, 8 output tokens each at most;
# 2. its concurrent profile (2 streams) over /v1/chat/completions: 4 of 4 succeed.
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
guidellm=${BRAID_GUIDELLM:-$(command -v guidellm || true)}
if [ -z "$guidellm" ] || ! [ -x "$guidellm" ]; then
  echo "skip: guidellm is not installed (pip install guidellm, or set BRAID_GUIDELLM)"
  exit 77
fi
work=$(mktemp -d)
failures=0
launcher_pid=""
trap 'cleanup' EXIT
cleanup() {
  [ -n "$launcher_pid" ] && kill -KILL -- "-$launcher_pid" 2> /dev/null
  rm -rf "$work"
}
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }

port=$(python3 "$here/free_port.py")
url=http://127.0.0.1:$port
BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --instances 1 --tp 1 --port "$port" \
  > "$work/server.out" 2> "$work/server.err" &
launcher_pid=$!
ready=0
for _ in $(seq 1 240); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && { ready=1; break; }
  kill -0 "$launcher_pid" 2> /dev/null || break
  sleep 0.5
done
if [ "$ready" != 1 ]; then fail "cluster never became ready"; cat "$work/server.err"; exit 1; fi
ok "cluster ready on port $port"

for i in 1 2 3 4 5 6 7 8; do
  echo "{\"prompt\": \"Question $i: name a colour of the sky.\", \"output_tokens_count\": 8}"
done > "$work/data.jsonl"

# run_guidellm NAME FORMAT PROFILE: 4 requests; the JSON report in $work/NAME.json.
run_guidellm() {
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 timeout 400 "$guidellm" run \
    --backend "kind=openai_http,target=$url,request_format=$2,max_tokens=8" --profile "$3" \
    --constraint kind=max_requests,count=4 --data "kind=json_file,path=$work/data.jsonl" \
    --output "kind=json,path=$work/$1.json" --disable-console > "$work/$1.log" 2>&1
}

run_guidellm sync /v1/completions kind=synchronous
check "guidellm synchronous (completions) exits 0" [ $? = 0 ] || tail -20 "$work/sync.log"
check "guidellm synchronous: 4 of 4 succeeded, at most 8 output tokens each" python3 - "$work/sync.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["benchmarks"][0]["metrics"]
assert b["request_totals"]["successful"] == 4 and b["request_totals"]["errored"] == 0, b["request_totals"]
out = b["output_token_count"]["successful"]
assert 0 < out["max"] <= 8, out
assert b["time_to_first_token_ms"]["successful"]["mean"] > 0
PY

run_guidellm conc /v1/chat/completions kind=concurrent,streams=2
check "guidellm concurrent, 2 streams (chat) exits 0" [ $? = 0 ] || tail -20 "$work/conc.log"
check "guidellm concurrent: 4 of 4 succeeded" python3 - "$work/conc.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["benchmarks"][0]["metrics"]
assert b["request_totals"]["successful"] == 4 and b["request_totals"]["errored"] == 0, b["request_totals"]
PY

kill -TERM "$launcher_pid"
wait "$launcher_pid"
launcher_pid=""
echo "$failures failures"
[ "$failures" -eq 0 ]
