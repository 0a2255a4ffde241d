#!/usr/bin/env bash
# Integration test of the cluster: real mpirun ranks, real HTTP, the official openai client.
#   tests/integration/test_cluster.sh BRAID_BINARY MODEL
# 1. 1 + 2x1 ranks: the openai client (chat, stream + usage, completion, cached prefix, 404); usage
#    split by cache tier (whole and streamed); per-tier cache counters in /metrics;
#    64 concurrent curl requests with the same greedy outputs as alone; every bad-input case
#    answers its 4xx and the server still answers; a client leaving mid-stream cancels its request;
#    SIGTERM drains an in-flight request, refuses new connections at once, exits 0, leaves no ranks;
#    --trace-out records a trace braid sim replays; --events logs the instances' KV events;
#    with --policy pbkv, a workflow's calls are forecast and the forecasts counted in /metrics.
# 2. 1 + 1x2 ranks (tensor parallel) on a tiny device pool with a host tier: greedy outputs equal
#    the T=1 ones, also for a prefix demoted to the host tier and loaded back; a full queue answers
#    429 with Retry-After.
# The python with the openai package: $BRAID_TEST_PYTHON, else .venv-test/bin/python (scripts/test.sh).
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${BRAID_TEST_PYTHON:-$root/.venv-test/bin/python}
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

post() {  # post PATH BODY [CURL ARGS...] -> the status; the body lands in $work/body
  local path=$1 body=$2; shift 2
  curl -s -o "$work/body" -w '%{http_code}' "$url$path" -H 'Content-Type: application/json' --data-binary "$body" "$@"
}
is_json_error() { python3 -c 'import json, sys; e = json.load(open(sys.argv[1]))["error"]; assert e["message"]' "$1" 2> /dev/null; }
metric_sum() {  # metric_sum FILE PREFIX -> the sum of the values of the series whose line starts with PREFIX
  awk -v p="$2" 'index($0, p) == 1 {s += $NF} END {print s + 0}' "$1"
}

greedy_text() {  # greedy_text PROMPT -> the completion text
  curl -s "$url/v1/completions" -H "Content-Type: application/json" -d "{\"prompt\": \"$1\", \"max_tokens\": 16, \"temperature\": 0}" |
    python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["text"]))'
}

greedy_cached() {  # greedy_cached PROMPT -> "TEXT<tab>CACHED_DEVICE<tab>CACHED_HOST" (prompt tokens from each tier)
  curl -s "$url/v1/completions" -H "Content-Type: application/json" -d "{\"prompt\": \"$1\", \"max_tokens\": 16, \"temperature\": 0}" |
    python3 -c 'import json, sys; d = json.load(sys.stdin); u = d["usage"]["prompt_tokens_details"]
print(json.dumps(d["choices"][0]["text"]), u["cached_tokens_device"], u["cached_tokens_host"], sep="\t")'
}
cached_of() { sed -n "${2}p" "$1" | cut -f2- | tr '\t' ' '; }  # cached_of FILE LINE -> "DEVICE HOST"

# events_have FILE CHECK: some "kv" line of an --events log satisfies CHECK (a python expression on e).
events_have() {
  python3 -c '
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
sys.exit(0 if any(eval("(" + sys.argv[2] + ")") for e in lines if e.get("event") == "kv") else 1)
' "$@"
}

prompts=("The capital of France is" "def fibonacci(n):" "Once upon a time" "The three primary colors are"
         "To make a cup of tea," "Water boils at" "The largest planet is" "A haiku about rain:")
# Two longer prompts, run as long_a, long_b, long_a: long_a's second run reuses its first 2 blocks
# (37 tokens); on the tensor-parallel run's tiny pool long_b (59 tokens + 16 = all 5 device blocks)
# pushes them to the host tier first, so that reuse is a load-back.
long_a="The history of the printing press begins in China, where woodblock printing was used on cloth and paper centuries before Gutenberg built his machine in Mainz. In a few sentences, explain why"
long_b="In a quiet village by the sea, an old lighthouse keeper kept a careful journal of every ship that passed his light, its name, its flag and the weather. One stormy night in November, with the lamp flickering and the wind howling at the windows, he wrote the following entry:"

# ---------------------------------------------------------------- 1 + 2x1
# These two clusters run the fp32 arithmetic explicitly: their greedy outputs are compared across
# --tp, which the int8 arithmetic rounds differently (see braid serve --help).
start_cluster two-instances --cpu-matmul fp32 --instances 2 --kv-blocks 256 --trace-out "$work/trace.jsonl" --events "$work/events.jsonl" \
  --policy pbkv --lora lora-a="$root/adapters/coder.gguf" || exit 1
served=$(curl -s "$url/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')

if [ -x "$python" ] && "$python" -c 'import openai' 2> /dev/null; then
  check "openai client suite" "$python" "$root/tests/integration/openai_client_test.py" "$url/v1" "$served"
else
  fail "the openai client is not installed for $python (scripts/test.sh sets it up)"
fi

for p in "${prompts[@]}"; do greedy_text "$p"; done > "$work/alone.txt"
for p in "$long_a" "$long_b" "$long_a"; do greedy_cached "$p"; done > "$work/alone_long.txt"
check "long_a's second run reuses its prefix from the device (cached $(cached_of "$work/alone_long.txt" 3))" \
  [ "$(cached_of "$work/alone_long.txt" 3)" = "32 0" ]
# 64 at once: each prompt 8 times, all greedy; every answer must equal the one computed alone.
for i in $(seq 0 63); do echo "${prompts[$((i % 8))]}"; done > "$work/concurrent.in"
tr '\n' '\0' < "$work/concurrent.in" | xargs -0 -P 64 -I{} sh -c \
  'curl -s -w "\n%{http_code}\n" "$1/v1/completions" -H "Content-Type: application/json" -d "{\"prompt\": \"$2\", \"max_tokens\": 16, \"temperature\": 0}" > "$3/c.$(echo "$2" | md5sum | cut -c1-8).$$"' \
  _ "$url" {} "$work"
codes_ok=$(cat "$work"/c.* | grep -cx 200)
check "64 concurrent requests all 200 (got $codes_ok)" [ "$codes_ok" = 64 ]
mismatch=0
for i in "${!prompts[@]}"; do
  want=$(sed -n "$((i + 1))p" "$work/alone.txt")
  for f in "$work"/c."$(echo "${prompts[$i]}" | md5sum | cut -c1-8)".*; do
    got=$(head -1 "$f" | python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["text"]))' 2> /dev/null)
    [ "$got" = "$want" ] || mismatch=$((mismatch + 1))
  done
done
check "64 concurrent greedy outputs equal the outputs alone ($mismatch differ)" [ "$mismatch" = 0 ]
# The gauges follow the burst at once (published when an instance's last request finishes), not at
# the next stats report.
curl -s "$url/metrics" > "$work/after_burst.txt"
check "right after the burst no sequence runs and no block is held (running $(metric_sum "$work/after_burst.txt" braid_instance_running_sequences), blocks $(metric_sum "$work/after_burst.txt" braid_instance_kv_blocks_used))" \
  [ "$(metric_sum "$work/after_burst.txt" braid_instance_running_sequences)" = 0 -a \
    "$(metric_sum "$work/after_burst.txt" braid_instance_kv_blocks_used)" = 0 ]
check "two instances start without a 'failed to start' error" bash -c "! grep -q 'failed to start' '$work/two-instances.err'"

# Sampling without a seed draws a fresh seed per request: 8 concurrent unseeded requests at
# temperature 1 all differ; a seeded request repeats itself, alone or concurrently.
sample() {  # sample OUT SEED_FIELD
  curl -s "$url/v1/completions" -H "Content-Type: application/json" \
    -d "{\"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 1.0, \"ignore_eos\": true $2}" |
    python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["text"]))' > "$1"
}
for i in $(seq 1 8); do sample "$work/unseeded.$i" "" & done
wait $(jobs -p | grep -v "^$launcher_pid$") 2> /dev/null
distinct=$(cat "$work"/unseeded.* | sort -u | grep -c .)
check "8 concurrent unseeded requests at temperature 1 give 8 different texts (got $distinct)" [ "$distinct" = 8 ]
sample "$work/seeded.0" ', "seed": 1234'
for i in 1 2 3; do sample "$work/seeded.$i" ', "seed": 1234' & done
wait $(jobs -p | grep -v "^$launcher_pid$") 2> /dev/null
check "a seeded request repeats itself, also concurrently" bash -c "[ -s '$work/seeded.0' ] && cat '$work'/seeded.* | sort -u | wc -l | grep -qx 1"

# max_model_len is what one request can hold: the pool (255 usable blocks of 16) here, below the
# model's 8192-token context, and a request reaching exactly it is accepted.
max_len=$(curl -s "$url/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["max_model_len"])')
check "/v1/models max_model_len is the pool's 4080 tokens (got $max_len)" [ "$max_len" = 4080 ]
n_hello=$(post /v1/completions '{"prompt": "hello", "max_tokens": 1}' > /dev/null; python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])' "$work/body")
code=$(curl -s -N --max-time 2 -o /dev/null -w '%{http_code}' "$url/v1/completions" -H "Content-Type: application/json" \
  -d "{\"prompt\": \"hello\", \"max_tokens\": $((max_len - n_hello)), \"stream\": true, \"ignore_eos\": true}")
check "prompt + max_tokens = max_model_len is accepted (got $code)" [ "$code" = 200 ]
code=$(post /v1/completions "{\"prompt\": \"hello\", \"max_tokens\": $((max_len - n_hello + 1))}")
check "prompt + max_tokens = max_model_len + 1 -> 400 (got $code)" bash -c "[ $code = 400 ] && grep -q context_length_exceeded '$work/body'"

# Bad input: status and a JSON error naming the problem, then the server still answers.
bad_case() {  # bad_case WANT_STATUS PATH BODY WHAT [CURL ARGS...]
  local code; code=$(post "$2" "$3" "${@:5}")
  if [ "$code" = "$1" ] && is_json_error "$work/body"; then
    ok "bad input: $4 -> $1"
  else
    fail "bad input: $4 -> want $1, got $code: $(head -c 200 "$work/body")"
  fi
}
bad_case 400 /v1/chat/completions '{"messages": [' "malformed JSON"
bad_case 400 /v1/chat/completions '[1, 2]' "not an object"
bad_case 400 /v1/chat/completions '{"max_tokens": 5}' "missing messages"
bad_case 400 /v1/chat/completions '{"messages": "hi"}' "messages of the wrong type"
bad_case 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}' "max_tokens 0"
bad_case 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -4}' "negative max_tokens"
bad_case 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}' "max_tokens of the wrong type"
bad_case 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1000000}' "max_tokens beyond the context"
bad_case 400 /v1/chat/completions '{"messages": [{"role": "wizard", "content": "hi"}]}' "unknown role"
bad_case 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "hi"}], "temperature": 9}' "temperature out of range"
bad_case 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "hi"}], "n": 17}' "n above 16"
bad_case 404 /v1/chat/completions '{"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}' "unknown model"
bad_case 400 /v1/completions '{"prompt": 42}' "prompt of the wrong type"
long_prompt=$(python3 -c 'print("word " * 9000)')
bad_case 400 /v1/completions "{\"prompt\": \"$long_prompt\", \"max_tokens\": 4}" "prompt longer than the context"
printf '{"prompt": "caf\xc3\x28 bad utf-8", "max_tokens": 2}' > "$work/badutf8"
bad_case 400 /v1/completions "$(cat "$work/badutf8")" "invalid UTF-8"
# Protocol faults (issue 22, point 8): each answered with a JSON error.
bad_case 400 /v1/chat/completions '{"messages": [{"role": "user", "content": "hi", "nmae": "bob"}]}' "unknown field inside a message"
bad_case 400 /v1/completions '{"prompt": "hi", "max_tokens": 2, "tenant": "acme"}' "body tenant conflicting with X-Braid-Tenant" \
  -H 'X-Braid-Tenant: globex'
code=$(curl -s -o "$work/body" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: text/plain' -d '{"prompt": "hi", "max_tokens": 2}')
check "Content-Type text/plain -> 415 with a JSON error (got $code)" bash -c "[ $code = 415 ] && grep -q unsupported_media_type '$work/body'"
code=$(curl -s -o "$work/body" -w '%{http_code}' "$url/v1/completions" -d '{"prompt": "hi", "max_tokens": 2}')
check "curl -d's form Content-Type -> 415 with a JSON error (got $code)" bash -c "[ $code = 415 ] && grep -q 'application/json' '$work/body'"
code=$(curl -s -o "$work/body" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type:' -d '{"prompt": "hi", "max_tokens": 2}')
check "no Content-Type at all is read as JSON (got $code)" [ "$code" = 200 ]
code=$(post /v1/completions '{"prompt": "hi", "max_tokens": 2}' -H 'Content-Type: Application/JSON; charset=utf-8')
check "Content-Type application/json with a charset is JSON (got $code)" [ "$code" = 200 ]
python3 -c 'print("X-Big: " + "a" * 200000)' > "$work/big_header"
code=$(curl -s -o "$work/body" -w '%{http_code}' "$url/health" -H @"$work/big_header")
check "200 KB of headers -> 431 with a JSON error (got $code)" bash -c "[ $code = 431 ] && python3 -c 'import json, sys; json.load(open(sys.argv[1]))[\"error\"]' '$work/body'"
# A garbage request line (issue 22, point 8) gets a JSON 400 from the front door (http_front_door.h),
# an unknown HTTP version a JSON 505; the server stays up.
raw_http() {  # raw_http BYTES -> "STATUS-LINE | error message" ("" when the server just closed)
  python3 -c '
import json, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
s.sendall(sys.argv[2].encode())
data = b""
try:
    while len(data) < 8192:
        chunk = s.recv(4096)
        if not chunk: break
        data += chunk
except OSError: pass
head, _, body = data.partition(b"\r\n\r\n")
try: message = json.loads(body)["error"]["message"]
except Exception: message = "NOT JSON: " + body[:80].decode("latin1")
print(head.split(b"\r\n")[0].decode("latin1") + " | " + message)' "$port" "$1"
}
starts_with() { [ "${1#"$2"}" != "$1" ]; }
answer=$(raw_http $'GARBAGE LINE\r\n\r\n')
check "a garbage request line with a blank -> JSON 400 ($answer)" starts_with "$answer" "HTTP/1.1 400 Bad Request | malformed request line"
answer=$(raw_http $'garbage\r\n\r\n')
check "a garbage request line without a blank -> JSON 400 ($answer)" starts_with "$answer" "HTTP/1.1 400 Bad Request | malformed request line"
answer=$(raw_http $'GET /health HTTP/9.9\r\n\r\n')
check "an unknown HTTP version -> JSON 505 ($answer)" starts_with "$answer" "HTTP/1.1 505 HTTP Version Not Supported | only HTTP/1.0"
check "the server answers after garbage request lines" [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ]
head -c 9000000 /dev/zero | tr '\0' 'a' > "$work/huge"
code=$(curl -s -o "$work/body" -w '%{http_code}' "$url/v1/completions" --data-binary @"$work/huge")
check "oversized body -> 413 (got $code)" [ "$code" = 413 ]
code=$(curl -s -o /dev/null -w '%{http_code}' "$url/v1/nothing-here")
check "unknown path -> 404 (got $code)" [ "$code" = 404 ]
code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$url/v1/chat/completions")
check "wrong method -> 405 (got $code)" [ "$code" = 405 ]
check "server still answers after bad input" [ "$(greedy_text "${prompts[0]}")" = "$(sed -n 1p "$work/alone.txt")" ]

# Workflow end and the X-Braid headers.
code=$(post /v1/workflows/wf-7/end '')
check "POST /v1/workflows/wf-7/end -> 200 (got $code)" [ "$code" = 200 ]
# The identity travels to the instance: the same tenant's second request reuses the first one's
# prefix, another tenant's identical prompt does not.
shared='{"prompt": "A long shared preamble about the history of tea, long enough to fill a couple of KV blocks. Question:", "max_tokens": 2}'
for n in 1 2; do
  code=$(curl -s -o "$work/labelled.$n.json" -w '%{http_code}' "$url/v1/completions" -H "Content-Type: application/json" -H 'X-Braid-Workflow: wf-8' \
    -H 'X-Braid-Agent: coder' -H 'X-Braid-Tenant: acme' -H 'X-Braid-Adapter: lora-a' -d "$shared")
done
check "X-Braid headers accepted (got $code)" [ "$code" = 200 ]
curl -s -o "$work/other_tenant.json" "$url/v1/completions" -H "Content-Type: application/json" -H 'X-Braid-Tenant: globex' -H 'X-Braid-Adapter: lora-a' -d "$shared"
# usage splits cached prompt tokens by tier: cached_tokens (OpenAI) = cached_tokens_device + cached_tokens_host.
usage_split() {  # usage_split FILE [CHECK]: the usage details of a whole answer or of an SSE stream's usage chunk
  python3 -c '
import json, sys
text = open(sys.argv[1]).read()
docs = [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: {")] or [json.loads(text)]
u = [d["usage"] for d in docs if d.get("usage")][-1]["prompt_tokens_details"]
assert u["cached_tokens"] == u["cached_tokens_device"] + u["cached_tokens_host"] and u["cached_tokens_host"] >= 0, u
cached = u["cached_tokens"]
assert eval(sys.argv[2] if len(sys.argv) > 2 else "True"), u
' "$@"
}
check "usage has cached_tokens_device and cached_tokens_host" usage_split "$work/labelled.1.json"
check "same tenant and adapter: the second request hits the cache" usage_split "$work/labelled.2.json" "cached >= 16"
check "another tenant shares nothing" usage_split "$work/other_tenant.json" "cached == 0"
# --events: the instances' KV events reach the coordinator's log in vLLM's shape, with the names.
check "--events logs the tenant's blocks stored on the device" events_have "$work/events.jsonl" \
  'e["type"] == "BlockStored" and e["medium"] == "device" and e["reason"] == "insert" and e["block_hashes"] and
   e["tenant"] == "acme" and e["adapter"] == "lora-a" and e["on_device"] and e["instance"] in (0, 1)'
# Workflow forecasts (PBKV live): three calls of a workflow (fields and headers) and its end all
# succeed; the coordinator forecast the calls, sent the forecasts to the instances' pbkv policy and
# scored each forecast's first step against the next call.
wf_codes=$(post /v1/completions '{"prompt": "Plan the work:", "max_tokens": 2, "workflow_id": "wf-pbkv", "agent": "planner"}')
wf_codes+=" $(curl -s -o /dev/null -w '%{http_code}' "$url/v1/completions" -H "Content-Type: application/json" -H 'X-Braid-Workflow: wf-pbkv' -H 'X-Braid-Agent: coder' \
  -d '{"prompt": "Write the code:", "max_tokens": 2}')"
wf_codes+=" $(post /v1/completions '{"prompt": "Review the code:", "max_tokens": 2, "workflow_id": "wf-pbkv", "agent": "reviewer"}')"
wf_codes+=" $(post /v1/workflows/wf-pbkv/end '')"
check "a workflow's three calls and its end succeed (got $wf_codes)" [ "$wf_codes" = "200 200 200 200" ]
curl -s "$url/metrics" > "$work/wf_metrics.txt"
metric() { awk -v name="$1" '$1 == name {print $2; found = 1} END {if (!found) print -1}' "$work/wf_metrics.txt"; }
check "metrics expose the workflow forecast series" \
  [ "$(metric braid_workflows_active)" -ge 0 -a "$(metric braid_workflow_forecast_step1_correct_total)" -ge 0 ]
check "forecasts were sent (braid_workflow_forecasts_total $(metric braid_workflow_forecasts_total))" \
  [ "$(metric braid_workflow_forecasts_total)" -gt 0 ]
check "the workflow's later calls were scored (step1 $(metric braid_workflow_forecast_step1_correct_total) of $(metric braid_workflow_forecast_step1_total))" \
  [ "$(metric braid_workflow_forecast_step1_total)" -ge 2 -a \
    "$(metric braid_workflow_forecast_step1_correct_total)" -le "$(metric braid_workflow_forecast_step1_total)" ]
curl -sN "$url/v1/completions" -H "Content-Type: application/json" -d '{"prompt": "hello", "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}' \
  > "$work/stream_usage.txt"
check "streamed usage chunk has the per-tier split" usage_split "$work/stream_usage.txt"

# A client that leaves mid-stream: its request is cancelled, not run to max_tokens.
timeout 1.5 curl -sN "$url/v1/completions" -H "Content-Type: application/json" -d '{"prompt": "Tell a long story", "max_tokens": 2000, "ignore_eos": true, "stream": true}' > /dev/null
sleep 1
running=$(curl -s "$url/metrics" | awk '/^braid_instance_running_sequences/ {s += $2} END {print s + 0}')
aborted=$(curl -s "$url/metrics" | grep -c 'status="499"')
check "client disconnect cancels its request (running now $running, 499 recorded $aborted)" [ "$running" = 0 -a "$aborted" -ge 1 ]
# The same for a client waiting on a whole (non-streamed) answer: noticed within about a second.
timeout 1.5 curl -s "$url/v1/completions" -H "Content-Type: application/json" -d '{"prompt": "Tell another long story", "max_tokens": 2000, "ignore_eos": true}' > /dev/null
sleep 2
running=$(curl -s "$url/metrics" | awk '/^braid_instance_running_sequences/ {s += $2} END {print s + 0}')
aborted=$(curl -s "$url/metrics" | awk '/status="499"/ {s += $2} END {print s + 0}')
check "non-streaming client disconnect cancels too (running now $running, 499s recorded $aborted)" [ "$running" = 0 -a "$aborted" -ge 2 ]
# TTFT: every successful request has a first token and is counted, also one whose first sampled
# token ended it (at temperature 2 about one seed in six of this prompt samples EOS first): 30
# completions and 2 chats sent, 30 and 2 more in the TTFT histogram.
curl -s "$url/metrics" > "$work/ttft_before.txt"
eos_first=0
for s in $(seq 1 30); do
  stream=false; [ $((s % 2)) = 0 ] && stream=true
  curl -s "$url/v1/completions" -H "Content-Type: application/json" -d "{\"prompt\": \"Thank you.\", \"max_tokens\": 1,
    \"temperature\": 2.0, \"top_k\": 3, \"seed\": $s, \"stream\": $stream, \"stream_options\": $([ $stream = true ] && echo '{"include_usage": true}' || echo null)}" > "$work/eos.$s"
  python3 -c '
import json, sys
text = open(sys.argv[1]).read()
docs = [json.loads(l[6:]) for l in text.splitlines() if l.startswith("data: {")] or [json.loads(text)]
sys.exit(0 if [d["usage"] for d in docs if d.get("usage")][-1]["completion_tokens"] == 0 else 1)' "$work/eos.$s" && eos_first=$((eos_first + 1))
done
check "some answers ended at their first token ($eos_first of 30)" [ "$eos_first" -ge 1 ]
for stream in false true; do
  curl -s -o /dev/null "$url/v1/chat/completions" -H "Content-Type: application/json" \
    -d "{\"messages\": [{\"role\": \"user\", \"content\": \"Thank you.\"}], \"max_tokens\": 2, \"stream\": $stream}"
done
curl -s "$url/metrics" > "$work/ttft_metrics.txt"
for sent in "chat 2" "completions 30"; do
  read -r ep n_sent <<< "$sent"
  ttft_series="braid_time_to_first_token_seconds_count{endpoint=\"$ep\"} "
  added=$(( $(metric_sum "$work/ttft_metrics.txt" "$ttft_series") - $(metric_sum "$work/ttft_before.txt" "$ttft_series") ))
  check "TTFT counted each of the $n_sent $ep requests just sent (added $added)" [ "$added" = "$n_sent" ]
  ok200=$(metric_sum "$work/ttft_metrics.txt" "braid_requests_total{endpoint=\"$ep\",status=\"200\"} ")
  ttft_n=$(metric_sum "$work/ttft_metrics.txt" "$ttft_series")
  check "TTFT counts every successful $ep request since start-up ($ttft_n of $ok200)" [ "$ttft_n" = "$ok200" -a "$ok200" -gt 0 ]
done
curl -s "$url/metrics" > "$work/metrics.txt"
metrics_ok=$(grep -cE '^braid_(request_latency_seconds_bucket|time_to_first_token_seconds_count|instance_kv_blocks_total|cached_prompt_tokens_total)' "$work/metrics.txt")
check "metrics expose latency, TTFT, pool and cache counters" [ "$metrics_ok" -ge 4 ]
tiers_ok=$(grep -cE '^braid_(prompt_tokens_cached_total\{tier="(device|host)"\}|prompt_tokens_computed_total|kv_demoted_blocks_total|kv_loaded_blocks_total|kv_host_evicted_blocks_total|kv_device_evicted_blocks_total|kv_host_blocks_used|kv_host_blocks_total) ' "$work/metrics.txt")
check "metrics expose the per-tier cache counters ($tiers_ok of 9 series)" [ "$tiers_ok" = 9 ]
check "the host tier is on by default (braid_kv_host_blocks_total > 0)" \
  awk '/^braid_kv_host_blocks_total / {found = $2 > 0} END {exit !found}' "$work/metrics.txt"
check "device cache hits are counted (the repeated tenant prompt)" \
  awk '/^braid_prompt_tokens_cached_total\{tier="device"\} / {found = $2 > 0} END {exit !found}' "$work/metrics.txt"

# SIGTERM while a request runs: it completes, a new connection is refused, everything exits 0.
curl -s -o "$work/inflight" -w '%{http_code}' "$url/v1/completions" -H "Content-Type: application/json" -d '{"prompt": "Write a story", "max_tokens": 256, "ignore_eos": true}' > "$work/inflight.code" &
curl_pid=$!
sleep 0.5
kill -TERM "$launcher_pid"
sleep 0.2
# The drain stops accepting at once (issue 37): a new connection is refused (curl: 000).
code=$(post /v1/completions '{"prompt": "late", "max_tokens": 2}' -D "$work/drain_headers")
check "a new connection during drain is refused (got $code)" [ "$code" = 000 ]
wait "$curl_pid"
check "in-flight request completed during drain ($(cat "$work/inflight.code"))" [ "$(cat "$work/inflight.code")" = 200 ]
wait "$launcher_pid"; status=$?
launcher_pid=""
check "drained cluster exits 0 (got $status)" [ "$status" = 0 ]
sleep 0.5
check "no ranks left after drain" cluster_gone
# The server's trace: the requests it served and the workflow end, replayable by braid sim.
n_traced=$(grep -c '"type":"request"' "$work/trace.jsonl")
check "trace records served requests ($n_traced) and the workflow ends" \
  bash -c "[ $n_traced -ge 64 ] && grep -q '\"type\":\"workflow_end\".*\"workflow\":\"wf-7\"' '$work/trace.jsonl' &&
           grep -q '\"type\":\"workflow_end\".*\"workflow\":\"wf-pbkv\"' '$work/trace.jsonl'"
"$braid" sim --trace "$work/trace.jsonl" --kv-tokens 4096 --json > "$work/sim.json" 2> /dev/null
check "braid sim replays the server's trace" grep -q '"workflow_ends":2' "$work/sim.json"
# The instances sent each workflow call's prefill hidden state (576 values for the default model)
# with its first token, and the trace kept it: PBKV's graph predictor trains on exactly this.
n_hidden=$(grep '"workflow":"wf-pbkv"' "$work/trace.jsonl" | grep -c '"hidden":"')
check "the workflow calls' trace lines carry their prefill hidden state ($n_hidden of 3)" [ "$n_hidden" = 3 ]
"$braid" train-predictor --traces "$work/trace.jsonl" --kind graph --epochs 5 --out "$work/graph.bin" 2> "$work/graph_train.log"
check "braid train-predictor --kind graph learns from the server's trace with its hidden states" \
  grep -q 'graph predictor: .* parameters, hidden states of 576 values' "$work/graph_train.log"

# ---------------------------------------------------------------- 1 + 1x2 (tensor parallel)
# 5 usable device blocks (80 tokens) and a 32-block host tier: the cache demotes and loads back.
start_cluster tensor-parallel --cpu-matmul fp32 --instances 1 --tp 2 --kv-blocks 6 --host-kv-blocks 32 --max-pending 2 \
  --events "$work/tp_events.jsonl" --policy pbkv --predictor "$work/graph.bin" || exit 1
# The graph predictor live: a workflow call is forecast at arrival and again once the instance
# returns its prefill hidden state (two forecasts for one call).
code=$(post /v1/completions '{"prompt": "Plan the work:", "max_tokens": 2, "workflow_id": "wf-graph", "agent": "planner"}')
sleep 0.2
forecasts=$(curl -s "$url/metrics" | awk '$1 == "braid_workflow_forecasts_total" {print $2}')
check "graph predictor: one call forecast at arrival and with its hidden state (got $code, $forecasts forecasts)" \
  [ "$code" = 200 -a "${forecasts:-0}" = 2 ]
for p in "${prompts[@]}"; do greedy_text "$p"; done > "$work/tp2.txt"
check "T=2 greedy outputs equal T=1" cmp -s "$work/alone.txt" "$work/tp2.txt"
for p in "$long_a" "$long_b" "$long_a"; do greedy_cached "$p"; done > "$work/tp2_long.txt"
check "T=2: long_a's prefix comes back from the host tier (cached $(cached_of "$work/tp2_long.txt" 3))" \
  [ "$(cached_of "$work/tp2_long.txt" 3)" = "0 32" ]
check "T=2 greedy outputs equal T=1 through demotion and load-back" \
  cmp -s <(cut -f1 "$work/alone_long.txt") <(cut -f1 "$work/tp2_long.txt")
sleep 0.3 # STATS come every 0.1 s
curl -s "$url/metrics" > "$work/tp_metrics.txt"
check "T=2: metrics expose PBKV's prefetch counters (prefetched, used, wasted)" \
  [ "$(grep -cE '^braid_kv_prefetch(ed|_hit|_wasted)_blocks_total ' "$work/tp_metrics.txt")" = 3 ]
check "T=2: blocks loaded back from the host tier (braid_kv_loaded_blocks_total > 0)" \
  awk '/^braid_kv_loaded_blocks_total / {found = $2 > 0} END {exit !found}' "$work/tp_metrics.txt"
check "T=2: --events logs the demotion to the host tier" events_have "$work/tp_events.jsonl" \
  'e["type"] == "BlockStored" and e["medium"] == "host" and e["reason"] == "demote" and e["on_host"]'
check "T=2: --events logs the load-back" events_have "$work/tp_events.jsonl" \
  'e["type"] == "BlockStored" and e["medium"] == "device" and e["reason"] == "load" and e["on_device"] and e["on_host"]'
for i in $(seq 1 8); do
  curl -s -D "$work/h.$i" -o /dev/null -w '%{http_code}\n' "$url/v1/completions" -H "Content-Type: application/json" \
    -d '{"prompt": "Keep talking", "max_tokens": 32, "ignore_eos": true}' > "$work/q.$i" &
done
wait $(jobs -p | grep -v "^$launcher_pid$") 2> /dev/null
n429=$(cat "$work"/q.* | grep -cx 429); n200=$(cat "$work"/q.* | grep -cx 200)
check "full queue: 429s ($n429) and successes ($n200), nothing else" [ "$n429" -ge 1 -a "$n200" -ge 1 -a $((n429 + n200)) = 8 ]
check "429 carries Retry-After" grep -qi '^retry-after:' $(grep -lx 429 "$work"/q.* | sed 's/q\./h./' | head -1)
stop_cluster tensor-parallel

echo "$failures failed"
[ "$failures" = 0 ]
