#!/usr/bin/env bash
# A standard PyPI benchmarking tool that targets any OpenAI endpoint (guidellm), against a live
# 1-instance Braid cluster, offline: no hub, no download at run time. The tokenizer guidellm counts
# with is the served GGUF's own, converted into a local tokenizer.json (bench/gguf_tokenizer_json.py).
#   tests/integration/test_bench_standard_tool.sh BRAID_BINARY MODEL
# guidellm is found as $BRAID_GUIDELLM, else .venv-test/bin/guidellm (scripts/test.sh installs
# guidellm 0.3.1 there: the last release without torch, ~0.55 GB with its deps), else `guidellm` on
# PATH; without it the test says so and exits 77 (ctest: skipped).
# guidellm 0.3.x (`guidellm benchmark`):
# 0. the GGUF's tokenizer, converted to tokenizer.json, encodes text exactly as `braid tokenize` does;
# 1. shared-prefix synthetic mode (64-token prefix common to all prompts), synchronous: 6 of 6
#    requests succeed, 0 errors, 1..8 output tokens each, prompts >= 64 tokens, TTFT > 0, and Braid's
#    braid_cached_prompt_tokens_total grows by >= 48 tokens for each request after the first;
# 2. chat completions, concurrent (2 streams), prompts from a local JSON-lines file: 4 of 4 succeed.
# guidellm >= 0.4 (`guidellm run`, bench/install_guidellm.sh): its synchronous and concurrent profiles.
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
guidellm=${BRAID_GUIDELLM:-}
[ -z "$guidellm" ] && [ -x "$root/.venv-test/bin/guidellm" ] && guidellm=$root/.venv-test/bin/guidellm
[ -z "$guidellm" ] && guidellm=$(command -v guidellm || true)
if [ -z "$guidellm" ] || ! [ -x "$guidellm" ]; then
  echo "skip: guidellm is not installed (scripts/test.sh installs it into .venv-test; or set BRAID_GUIDELLM)"
  exit 77
fi
# The interpreter of guidellm's own venv: the tokenizer conversion uses its gguf and tokenizers.
python=$(dirname "$guidellm")/python
[ -x "$python" ] || python=python3
version=$("$guidellm" --version 2> /dev/null | grep -oE '[0-9]+\.[0-9]+(\.[0-9]+)?' | head -1)
echo "guidellm $version at $guidellm"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_TELEMETRY=1
work=$(mktemp -d)
export HF_HOME=$work/hf
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

# cached_tokens: Braid's count of prompt tokens of finished requests that were served from cache.
cached_tokens() {
  curl -s "$url/metrics" | awk '/^braid_cached_prompt_tokens_total / {print $2; found = 1} END {if (!found) print 0}'
}

# ---- guidellm 0.3.x -------------------------------------------------------------------------------
# run_guidellm03 NAME ARGS...: one benchmark; the JSON report in $work/NAME.json, the log beside it.
run_guidellm03() {
  local name=$1; shift
  timeout 300 "$guidellm" benchmark --target "$url" --processor "$work/tokenizer" \
    --output-path "$work/$name.json" --disable-progress --disable-console-outputs "$@" > "$work/$name.log" 2>&1
}

run_v03() {
  check "the GGUF's tokenizer, converted to a local tokenizer.json, encodes as braid tokenize does" \
    "$python" - "$model" "$work/tokenizer" "$braid" "$root/bench/gguf_tokenizer_json.py" <<'PY'
import subprocess, sys
from transformers import AutoTokenizer
model, out, braid, convert = sys.argv[1:5]
subprocess.run([sys.executable, convert, model, out], check=True)
text = "Benchmarks count tokens: the quick brown fox, 12345 times.\nA second line. <|im_start|>user"
ours = AutoTokenizer.from_pretrained(out).encode(text, add_special_tokens=False)
braids = subprocess.run([braid, "tokenize", "--model", model, "--no-bos"], input=text.encode(),
                        capture_output=True, check=True).stdout.split()
assert ours == [int(t) for t in braids], (ours, braids)
PY

  local before after
  before=$(cached_tokens)
  run_guidellm03 prefix --rate-type synchronous --max-requests 6 \
    --data "prefix_tokens=64,prompt_tokens=16,output_tokens=8"
  local rc=$?
  check "guidellm shared-prefix synchronous (completions) exits 0" [ "$rc" = 0 ]
  [ "$rc" = 0 ] || tail -20 "$work/prefix.log"
  after=$(cached_tokens)
  check "guidellm shared prefix: 6 of 6 succeeded, 0 errored, 1..8 output tokens, prompts >= 64 tokens" \
    python3 - "$work/prefix.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["benchmarks"][0]
totals = b["request_totals"]
assert totals["successful"] == 6 and totals["errored"] == 0 and totals["incomplete"] == 0, totals
reqs = b["requests"]["successful"]
assert len(reqs) == 6, len(reqs)
for r in reqs:
    assert 0 < r["output_tokens"] <= 8, r["output_tokens"]
    assert r["prompt_tokens"] >= 64, r["prompt_tokens"]
assert b["metrics"]["time_to_first_token_ms"]["successful"]["mean"] > 0
assert b["metrics"]["output_token_count"]["successful"]["total_sum"] > 0
PY
  echo "braid_cached_prompt_tokens_total: $before -> $after"
  check "Braid's prefix cache served >= 48 prompt tokens to each of the 5 later requests" \
    [ "$((${after%.*} - ${before%.*}))" -ge $((5 * 48)) ]

  GUIDELLM__PREFERRED_ROUTE=chat_completions run_guidellm03 chat --rate-type concurrent --rate 2 \
    --max-requests 4 --data "$work/data.jsonl"
  rc=$?
  check "guidellm concurrent, 2 streams (chat) exits 0" [ "$rc" = 0 ]
  [ "$rc" = 0 ] || tail -20 "$work/chat.log"
  check "guidellm concurrent chat: 4 of 4 succeeded, 0 errored, output tokens > 0" \
    python3 - "$work/chat.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))["benchmarks"][0]
totals = b["request_totals"]
assert totals["successful"] == 4 and totals["errored"] == 0 and totals["incomplete"] == 0, totals
assert all(r["request_type"] == "chat_completions" for r in b["requests"]["successful"])
assert all(r["output_tokens"] > 0 for r in b["requests"]["successful"])
PY
}

# ---- guidellm >= 0.4 (bench/install_guidellm.sh) --------------------------------------------------
# run_guidellm NAME FORMAT PROFILE: 4 requests; the JSON report in $work/NAME.json.
run_guidellm() {
  timeout 400 "$guidellm" run \
    --backend "kind=openai_http,target=$url,request_format=$2,max_tokens=8" --profile "$3" \
    --constraint kind=max_requests,count=4 --data "kind=json_file,path=$work/data.jsonl" \
    --output "kind=json,path=$work/$1.json" --disable-console > "$work/$1.log" 2>&1
}

run_v04() {
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
}

case $version in
  0.[0-3].*) run_v03 ;;
  *) run_v04 ;;
esac

kill -TERM "$launcher_pid"
wait "$launcher_pid"
launcher_pid=""
echo "$failures failures"
[ "$failures" -eq 0 ]
