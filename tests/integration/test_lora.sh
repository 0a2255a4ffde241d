#!/usr/bin/env bash
# Integration test of LoRA serving (issue 16, first half): real mpirun ranks, real HTTP, the
# committed adapters in adapters.
#   tests/integration/test_lora.sh BRAID_BINARY MODEL
# 1. Start-up refusals: --lora-cache shared without an adapter, --residual-blocks without shared,
#    a malformed adapter file (the message names the file), --lora with --tp 2; --help documents
#    --lora, --lora-cache and --residual-blocks.
# 2. braid batch --lora: a line naming a loaded adapter is served (and differs from the base
#    model's answer), one naming an unknown adapter gets an error, the others still run.
# 3. 1 + 1x1 ranks with --lora planner=... --lora coder=...: /v1/models lists the base model and
#    both adapters (parent = the base); the adapter picked by the "adapter" field, the
#    X-Braid-Adapter header or "model" gives the same greedy answer, which differs from the base
#    model's; an unknown adapter or model is a 404 with a JSON error; model and adapter naming
#    different adapters is a 400; the same prompt under another adapter gets cached_tokens 0,
#    under the same adapter a hit (--lora-cache separate).
# 4. --lora-cache shared (ForkKV) on the same cluster shape: the coder's greedy answer equals
#    separate mode's; the planner on the coder's prompt forks (cached_tokens 0, /metrics counts
#    fork tokens: the base was shared, only the residual computed); the planner's repeat is a full
#    hit; /metrics shows the residual pool; braid batch --lora-cache shared serves the same.
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
adapters=$root/adapters
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"
json_get() {  # json_get FILE EXPR: evaluates EXPR with d = the file's JSON
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2> /dev/null
}

# ---------------------------------------------------------------- 1. start-up
check "--help documents --lora" bash -c "'$braid' batch --help | grep -q -- '--lora NAME=PATH'"
check "serve --help documents --lora-cache" bash -c "'$braid' serve --help 2> /dev/null | grep -q -- '--lora-cache MODE'"
port=$(free_port)
check "serve --help documents --residual-blocks" bash -c "'$braid' serve --help 2> /dev/null | grep -q -- '--residual-blocks N'"
BRAID_BIN=$braid timeout 60 "$root/launch/braid-local" --model "$model" --port "$port" --lora-cache shared \
  > "$work/shared.out" 2> "$work/shared.err"
status=$?
check "--lora-cache shared without an adapter stops the server (exit $status)" [ "$status" != 0 -a "$status" != 124 ]
check "... saying it needs one" grep -q "lora-cache shared needs at least one --lora adapter" "$work/shared.err"
"$braid" batch --model "$model" --input /dev/null --output "$work/none.jsonl" --residual-blocks 64 2> "$work/resblocks.err"
check "--residual-blocks without --lora-cache shared is refused" grep -q "residual-blocks needs --lora-cache shared" "$work/resblocks.err"
head -c 4096 "$model" > "$work/truncated.gguf"
BRAID_BIN=$braid timeout 60 "$root/launch/braid-local" --model "$model" --port "$port" --lora bad="$work/truncated.gguf" \
  > "$work/badfile.out" 2> "$work/badfile.err"
status=$?
check "a malformed adapter file stops the server (exit $status)" [ "$status" != 0 -a "$status" != 124 ]
check "... naming the file" grep -q "truncated.gguf" "$work/badfile.err"
BRAID_BIN=$braid timeout 60 "$root/launch/braid-local" --model "$model" --port "$port" --lora "$model" > "$work/noname.out" 2> "$work/noname.err"
check "--lora without NAME= is refused with the expected form" grep -q "expected NAME=PATH" "$work/noname.err"
BRAID_BIN=$braid timeout 60 "$root/launch/braid-local" --tp 2 --model "$model" --port "$port" --lora coder="$adapters/coder.gguf" \
  > "$work/tp.out" 2> "$work/tp.err"
check "--lora with --tp 2 is refused" grep -q "lora needs --tp 1" "$work/tp.err"

# ---------------------------------------------------------------- 2. braid batch
# Every run below uses the fp32 arithmetic: shared mode (ForkKV) approximates separate mode's
# K/V (bench/RESULTS.md, ForkKV accuracy), and the greedy answers compared here agree in fp32; the
# default int8 rounding tips a near-tie in this prompt's third token under shared mode.
prompt='<|im_start|>user\nWrite the function divide for a calculator.<|im_end|>\n<|im_start|>assistant\n'
cat > "$work/in.jsonl" <<EOF
{"id": "base", "prompt": "$prompt", "max_tokens": 12}
{"id": "coder", "prompt": "$prompt", "max_tokens": 12, "adapter": "coder"}
{"id": "nope", "prompt": "$prompt", "max_tokens": 12, "adapter": "nope"}
EOF
"$braid" batch --model "$model" --device cpu --cpu-matmul fp32 --input "$work/in.jsonl" --output "$work/out.jsonl" --lora coder="$adapters/coder.gguf" \
  --lora-cache separate > "$work/batch.log" 2>&1
check "batch --lora exits 0" [ $? = 0 ]
line() { python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[int(sys.argv[2])]).get(sys.argv[3]))' "$work/out.jsonl" "$@"; }
check "batch: the coder line is served" [ "$(line 1 completion_tokens)" = 12 ]
check "batch: the adapter changes the answer" [ "$(line 0 text)" != "$(line 1 text)" ]
check "batch: an unknown adapter is an error line" grep -q "\"id\":\"nope\".*unknown LoRA adapter 'nope'" "$work/out.jsonl"
check "batch: the identical prompt under coder shares no cache with the base model" [ "$(line 1 cached_tokens)" = 0 ]
# --lora-cache auto: the cost model measures the kernels at start-up; with nothing evicted yet it
# gives the coder a separate cache, so the answers are separate mode's.
"$braid" batch --model "$model" --device cpu --cpu-matmul fp32 --input "$work/in.jsonl" --output "$work/out-auto.jsonl" \
  --lora coder="$adapters/coder.gguf" --lora-cache auto > "$work/batch-auto.log" 2>&1
check "batch --lora-cache auto exits 0" [ $? = 0 ]
check "batch auto: measures the attention kernels at start-up" grep -q -- "--lora-cache auto: attention per slot" "$work/batch-auto.log"
check "batch auto: the coder's answer is separate mode's" \
  [ "$(python3 -c 'import json, sys; print([json.loads(l)["text"] for l in open(sys.argv[1])][1])' "$work/out-auto.jsonl")" = "$(line 1 text)" ]

# ---------------------------------------------------------------- 3. the cluster
port=$(free_port)
url=http://127.0.0.1:$port
BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --kv-blocks 128 --device cpu --cpu-matmul fp32 \
  --lora planner="$adapters/planner.gguf" --lora coder="$adapters/coder.gguf" --lora-cache separate > "$work/serve.out" 2> "$work/serve.err" &
launcher_pid=$!
if ! wait_ready; then
  fail "the LoRA cluster never became ready"; cat "$work/serve.err"; exit 1
fi
curl -s "$url/v1/models" > "$work/models.json"
base=$(json_get "$work/models.json" 'd["data"][0]["id"]')
check "/v1/models lists the base model and both adapters" \
  [ "$(json_get "$work/models.json" '[m["id"] for m in d["data"]][1:]')" = "['planner', 'coder']" ]
check "/v1/models gives each adapter the base model as parent" \
  [ "$(json_get "$work/models.json" 'set(m.get("parent") for m in d["data"][1:])')" = "{'$base'}" ]

post() {  # post NAME BODY [CURL ARGS...]: writes $work/NAME.json, prints the status
  local name=$1 body=$2; shift 2
  curl -s -o "$work/$name.json" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' "$@" -d "$body"
}
long='The following is the shared brief for every agent of this workflow. The team builds a small inventory service with a REST API, a SQLite store and a command-line client; every change needs a test and a short note. Task:'
body() { printf '{"prompt": "%s", "max_tokens": 8, "temperature": 0%s}' "$long" "$1"; }
check "base model: 200" [ "$(post base "$(body '')")" = 200 ]
check "adapter by field: 200" [ "$(post field "$(body ', "adapter": "coder"')")" = 200 ]
check "adapter by header: 200" [ "$(post header "$(body '')" -H 'X-Braid-Adapter: coder')" = 200 ]
check "adapter by model name: 200" [ "$(post model "$(body ', "model": "coder"')")" = 200 ]
text() { json_get "$work/$1.json" 'd["choices"][0]["text"]'; }
cached() { json_get "$work/$1.json" 'd["usage"]["prompt_tokens_details"]["cached_tokens"]'; }
check "field, header and model name pick the same adapter" [ "$(text field)" = "$(text header)" -a "$(text field)" = "$(text model)" ]
check "the adapter's answer differs from the base model's" [ "$(text field)" != "$(text base)" ]
check "an answer picked by model name is labelled with the adapter" [ "$(json_get "$work/model.json" 'd["model"]')" = coder ]
check "the same prompt under coder after the base model: cached_tokens 0" [ "$(cached field)" = 0 ]
check "coder again (header): its own cache hits" [ "$(cached header)" -ge 16 ]
check "planner after base and coder: cached_tokens 0" [ "$(post planner "$(body ', "adapter": "planner"')")" = 200 -a "$(cached planner)" = 0 ]
code=$(post unknown "$(body ', "adapter": "summarizer"')")
check "an unknown adapter is a 404 adapter_not_found (got $code)" \
  [ "$code" = 404 -a "$(json_get "$work/unknown.json" 'd["error"]["code"]')" = adapter_not_found ]
code=$(post unknown_header "$(body '')" -H 'X-Braid-Adapter: nope')
check "an unknown adapter by header is a 404 too (got $code)" [ "$code" = 404 ]
code=$(post unknown_model "$(body ', "model": "nope"')")
check "an unknown model is a 404 model_not_found naming the adapters (got $code)" \
  [ "$code" = 404 -a "$(json_get "$work/unknown_model.json" 'd["error"]["code"]')" = model_not_found ] && grep -q "planner" "$work/unknown_model.json"
code=$(post conflict "$(body ', "model": "coder", "adapter": "planner"')")
check "model and adapter naming different adapters is a 400 (got $code)" [ "$code" = 400 ]
code=$(curl -s -o "$work/chat.json" -w '%{http_code}' "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "planner", "messages": [{"role": "user", "content": "Plan a picnic."}], "max_tokens": 6}')
check "chat completions take the adapter by model name (got $code)" [ "$code" = 200 ]

kill -TERM "$launcher_pid"
wait "$launcher_pid"
status=$?
launcher_pid=""
check "SIGTERM drains and exits 0 (got $status)" [ "$status" = 0 ]

# ---------------------------------------------------------------- 4. --lora-cache shared (ForkKV)
port=$(free_port)
url=http://127.0.0.1:$port
BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --kv-blocks 128 --device cpu --cpu-matmul fp32 \
  --lora planner="$adapters/planner.gguf" --lora coder="$adapters/coder.gguf" --lora-cache shared --residual-blocks 96 \
  > "$work/fork.out" 2> "$work/fork.err" &
launcher_pid=$!
if ! wait_ready; then
  fail "the ForkKV cluster never became ready"; cat "$work/fork.err"; exit 1
fi
metric() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
check "shared: coder 200" [ "$(post fk_coder "$(body ', "adapter": "coder"')")" = 200 ]
check "shared: the coder's greedy answer is separate mode's" [ "$(text fk_coder)" = "$(text field)" ]
check "shared: planner on the coder's prompt 200" [ "$(post fk_planner "$(body ', "adapter": "planner"')")" = 200 ]
check "shared: ... cached_tokens 0 (its residual was not cached)" [ "$(cached fk_planner)" = 0 ]
forks=$(metric braid_kv_fork_tokens_total)
check "shared: ... but it forked from the coder's base blocks (fork tokens $forks)" [ "${forks:-0}" -ge 16 ]
check "shared: planner again: a full hit (base + residual)" \
  [ "$(post fk_planner2 "$(body ', "adapter": "planner"')")" = 200 -a "$(cached fk_planner2)" -ge 16 ]
check "shared: the repeat answers the same" [ "$(text fk_planner2)" = "$(text fk_planner)" ]
check "shared: /metrics shows the residual pool" [ "$(metric 'braid_instance_kv_residual_total_blocks{instance="0"}')" = 95 ]
check "shared: residual hits counted" [ "$(metric braid_kv_residual_hit_tokens_total)" -ge 16 ]
kill -TERM "$launcher_pid"
wait "$launcher_pid"
status=$?
launcher_pid=""
check "shared: SIGTERM drains and exits 0 (got $status)" [ "$status" = 0 ]
"$braid" batch --model "$model" --device cpu --cpu-matmul fp32 --input "$work/in.jsonl" --output "$work/fk_out.jsonl" --lora coder="$adapters/coder.gguf" \
  --lora-cache shared > "$work/fk_batch.log" 2>&1
check "batch --lora-cache shared exits 0" [ $? = 0 ]
check "batch shared: the coder line answers as in separate mode" \
  [ "$(python3 -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[1])["text"])' "$work/fk_out.jsonl")" = "$(line 1 text)" ]

echo "$failures failed"
[ "$failures" = 0 ]
