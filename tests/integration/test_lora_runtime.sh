#!/usr/bin/env bash
# Integration test of LoRA adapters at run time (issue 32, item 4): POST /v1/load_lora_adapter and
# /v1/unload_lora_adapter over real HTTP against real mpirun ranks and the committed adapters.
#   tests/integration/test_lora_runtime.sh BRAID_BINARY MODEL
# 1. 1 + 2 instances, --lora-cache separate, --api-keys with an admin key and a plain key,
#    --lora coder=adapters/coder.gguf at start-up: no key 401, a plain key 403; the admin key loads
#    coder.gguf again as "coder2" (200, plain-text success); /v1/models lists it; its greedy answer
#    equals the start-up coder's and differs from the base model's; a duplicate name, a reused start-up
#    name, a missing file, a malformed file and malformed bodies are 4xx JSON naming the problem (and
#    the failed names are not listed); an unload with a request of the adapter in flight is a 409 that
#    says so; once that request is cancelled (its client went away) the unload is a 200, the name is gone from /v1/models, a request naming it
#    is a 404 and unloading it again is a 404; loading that name again (with planner.gguf) is a 200,
#    and it answers as planner.gguf does with none of the old adapter's K/V (issue 32 gap: a
#    generation-qualified cache namespace, and the unload drops the old one).
# 2. 1 + 1 instance, --lora-cache shared (ForkKV), no keys but --allow-runtime-lora: coder.gguf
#    loaded at run time answers as the start-up coder; planner.gguf loaded at run time differs from
#    the base model and repeats itself from cache; unload works. (Shared and separate mode's greedy
#    answers are not compared here: ForkKV approximates K/V, test_lora.sh compares them on its prompt.)
# 3. A server started without any --lora (--allow-runtime-lora): a run-time coder answers as the
#    --lora coder of part 1.
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
admin_key=adminkey-0123456789abcdef
user_key=userkey-0123456789abcdef
cat > "$work/keys" <<KEYS
$admin_key tenant=ops admin adapters=*
$user_key tenant=alice adapters=*
KEYS
auth=()
admin() {  # admin NAME ENDPOINT BODY: POST with the current auth, writes $work/NAME.json, prints the status
  curl -s -o "$work/$1.json" -w '%{http_code}' "$url/v1/$2" -H 'Content-Type: application/json' "${auth[@]}" -d "$3"
}
post() {  # post NAME BODY: a completion with the current auth; writes $work/NAME.json, prints the status
  curl -s -o "$work/$1.json" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' "${auth[@]}" -d "$2"
}
prompt='The following is the shared brief for every agent of this workflow. The team builds a small inventory service. Task:'
body() { printf '{"prompt": "%s", "max_tokens": 8, "temperature": 0%s}' "$prompt" "$1"; }
text() { json_get "$work/$1.json" 'd["choices"][0]["text"]'; }
models() { curl -s "$url/v1/models" "${auth[@]}" | python3 -c 'import json, sys; print(" ".join(m["id"] for m in json.load(sys.stdin)["data"][1:]))'; }
is_json_error() { [ -n "$(json_get "$work/$1.json" 'd["error"]["message"]')" ]; }

# ---------------------------------------------------------------- 1. separate mode, API keys
start_cluster keyed --instances 2 --kv-blocks 128 --device cpu --cpu-matmul fp32 --api-keys "$work/keys" \
  --lora coder="$adapters/coder.gguf" --lora-cache separate || exit 1
load_coder2='{"lora_name": "coder2", "lora_path": "'"$adapters/coder.gguf"'"}'
auth=()
code=$(admin nokey load_lora_adapter "$load_coder2")
check "no key: 401 (got $code)" [ "$code" = 401 ] && is_json_error nokey
auth=(-H "Authorization: Bearer $user_key")
code=$(admin userkey load_lora_adapter "$load_coder2")
check "a key without admin: 403 JSON saying admin is needed (got $code)" [ "$code" = 403 ] && grep -q admin "$work/userkey.json"
auth=(-H "Authorization: Bearer $admin_key")
code=$(admin load load_lora_adapter "$load_coder2")
check "the admin key loads coder2: 200 (got $code)" [ "$code" = 200 ] && grep -q "Success" "$work/load.json"
check "/v1/models lists coder2 at once" [ "$(models)" = "coder coder2" ]
check "base: 200" [ "$(post base "$(body '')")" = 200 ]
check "start-up coder: 200" [ "$(post coder "$(body ', "adapter": "coder"')")" = 200 ]
check "run-time coder2: 200" [ "$(post coder2 "$(body ', "adapter": "coder2"')")" = 200 ]
check "coder2 answers exactly as the start-up coder (same file)" [ "$(text coder2)" = "$(text coder)" -a -n "$(text coder)" ]
check "... which differs from the base model" [ "$(text coder2)" != "$(text base)" ]
check "coder2 by model name: 200, the same answer" [ "$(post coder2m "$(body ', "model": "coder2"')")" = 200 -a "$(text coder2m)" = "$(text coder)" ]
code=$(admin dup load_lora_adapter "$load_coder2")
check "loading coder2 again: 409 (got $code)" [ "$code" = 409 ] && grep -q "already loaded" "$work/dup.json"
code=$(admin dup_startup load_lora_adapter '{"lora_name": "coder", "lora_path": "'"$adapters/planner.gguf"'"}')
check "the start-up name coder: 409 (got $code)" [ "$code" = 409 ]
code=$(admin missing load_lora_adapter '{"lora_name": "ghost", "lora_path": "'"$work/nope.gguf"'"}')
check "a missing file: 400 naming it (got $code)" [ "$code" = 400 ] && grep -q "nope.gguf" "$work/missing.json"
head -c 4096 "$model" > "$work/truncated.gguf"
code=$(admin bad load_lora_adapter '{"lora_name": "bad", "lora_path": "'"$work/truncated.gguf"'"}')
check "a malformed file: 400 naming it (got $code)" [ "$code" = 400 ] && grep -q "truncated.gguf" "$work/bad.json"
code=$(admin notadapter load_lora_adapter '{"lora_name": "bad2", "lora_path": "'"$model"'"}')
check "a model file, not an adapter: 400 (got $code)" [ "$code" = 400 ] && is_json_error notadapter
check "failed loads are listed nowhere" [ "$(models)" = "coder coder2" ]
code=$(admin nobody load_lora_adapter 'not json')
check "a body that is not JSON: 400 JSON (got $code)" [ "$code" = 400 ] && is_json_error nobody
code=$(admin nopath load_lora_adapter '{"lora_name": "x"}')
check "no lora_path: 400 naming it (got $code)" [ "$code" = 400 ] && grep -q lora_path "$work/nopath.json"
code=$(curl -s -o "$work/get.json" -w '%{http_code}' "$url/v1/load_lora_adapter" "${auth[@]}")
check "GET: 405 (got $code)" [ "$code" = 405 ]
# In flight: a long streamed generation with coder2 holds it (the unload waits for its first token,
# so the request is surely in flight); the unload is refused and says why.
curl -s -N -o "$work/long.sse" "$url/v1/completions" -H 'Content-Type: application/json' "${auth[@]}" \
  -d '{"prompt": "Write a long story about a lighthouse keeper.", "max_tokens": 1500, "temperature": 0, "ignore_eos": true, "stream": true, "adapter": "coder2"}' &
long_pid=$!
wait_for 30 grep -q '^data: {' "$work/long.sse"
code=$(admin busy unload_lora_adapter '{"lora_name": "coder2"}')
check "unload with a request in flight: 409 saying so (got $code)" [ "$code" = 409 ] && grep -q "in flight" "$work/busy.json"
check "the request in flight streams coder2's tokens, no error" bash -c "! grep -q '\"error\"' '$work/long.sse'"
# The client goes away: its request is cancelled, and then the unload goes through.
kill "$long_pid" 2> /dev/null; wait "$long_pid" 2> /dev/null
unload_ok() { [ "$(admin unload unload_lora_adapter '{"lora_name": "coder2"}')" = 200 ]; }
wait_for 30 unload_ok
check "unload coder2 once its request was cancelled: 200" grep -q "Success" "$work/unload.json"
check "/v1/models no longer lists coder2" [ "$(models)" = "coder" ]
check "the instances dropped coder2's cache at once (leader log: blocks freed)" grep -Eq "adapter 'coder2': its cache dropped \([1-9][0-9]* blocks freed" "$work/keyed.err"
code=$(post gone "$(body ', "adapter": "coder2"')")
check "a request naming coder2 now: 404 (got $code)" [ "$code" = 404 ]
code=$(admin unload2 unload_lora_adapter '{"lora_name": "coder2"}')
check "unloading it again: 404 (got $code)" [ "$code" = 404 ] && is_json_error unload2
# The unloaded name loads again (its next generation) with other weights: it answers from those
# weights and finds none of the old coder2's K/V (its cache namespace is new, and the unload dropped
# the old one), then caches its own.
code=$(admin reuse load_lora_adapter '{"lora_name": "coder2", "lora_path": "'"$adapters/planner.gguf"'"}')
check "loading the unloaded name again (planner.gguf this time): 200 (got $code)" [ "$code" = 200 ]
code=$(admin planner_ref load_lora_adapter '{"lora_name": "planner_ref", "lora_path": "'"$adapters/planner.gguf"'"}')
check "planner.gguf as planner_ref: 200 (got $code)" [ "$code" = 200 ]
check "reloaded coder2: 200" [ "$(post coder2_again "$(body ', "adapter": "coder2"')")" = 200 ]
cached() { json_get "$work/$1.json" 'd["usage"]["prompt_tokens_details"]["cached_tokens"]'; }
check "... no cached token of the old coder2's prompt (got $(cached coder2_again))" [ "$(cached coder2_again)" = 0 ]
check "planner_ref: 200" [ "$(post planner_ref_out "$(body ', "adapter": "planner_ref"')")" = 200 ]
check "... the reloaded coder2 answers exactly as planner.gguf does" [ "$(text coder2_again)" = "$(text planner_ref_out)" -a -n "$(text planner_ref_out)" ]
check "... not as the old coder2" [ "$(text coder2_again)" != "$(text coder)" ]
check "reloaded coder2 again: 200" [ "$(post coder2_third "$(body ', "adapter": "coder2"')")" = 200 ]
check "... now from its own cache (cached $(cached coder2_third))" [ "$(cached coder2_third)" -ge 16 ] 2> /dev/null
check "/v1/models lists the reloaded name once" [ "$(models)" = "coder coder2 planner_ref" ]
check "the start-up coder still serves the same" [ "$(post coder_after "$(body ', "adapter": "coder"')")" = 200 -a "$(text coder_after)" = "$(text coder)" ]
stop_cluster keyed

# ---------------------------------------------------------------- 2. shared mode (ForkKV), open with --allow-runtime-lora
auth=()
start_cluster shared --kv-blocks 128 --device cpu --cpu-matmul fp32 --allow-runtime-lora \
  --lora coder="$adapters/coder.gguf" --lora-cache shared --residual-blocks 96 || exit 1
code=$(admin s_load load_lora_adapter '{"lora_name": "coder_rt", "lora_path": "'"$adapters/coder.gguf"'"}')
check "shared: loading coder_rt without a key (--allow-runtime-lora): 200 (got $code)" [ "$code" = 200 ]
code=$(admin s_load2 load_lora_adapter '{"lora_name": "planner_rt", "lora_path": "'"$adapters/planner.gguf"'"}')
check "shared: loading planner_rt: 200 (got $code)" [ "$code" = 200 ]
check "shared: /v1/models lists both" [ "$(models)" = "coder coder_rt planner_rt" ]
check "shared: base 200" [ "$(post s_base "$(body '')")" = 200 ]
check "shared: coder 200" [ "$(post s_coder "$(body ', "adapter": "coder"')")" = 200 ]
check "shared: coder_rt 200" [ "$(post s_coder_rt "$(body ', "adapter": "coder_rt"')")" = 200 ]
check "shared: coder_rt answers as the start-up coder" [ "$(text s_coder_rt)" = "$(text s_coder)" -a -n "$(text s_coder)" ]
check "shared: planner_rt 200" [ "$(post s_planner "$(body ', "adapter": "planner_rt"')")" = 200 ]
check "shared: planner_rt differs from the base model" [ "$(text s_planner)" != "$(text s_base)" ]
check "shared: planner_rt again: 200" [ "$(post s_planner2 "$(body ', "adapter": "planner_rt"')")" = 200 ]
check "shared: ... the same answer, from its cache" \
  [ "$(text s_planner2)" = "$(text s_planner)" -a "$(json_get "$work/s_planner2.json" 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" -ge 16 ]
code=$(admin s_unload unload_lora_adapter '{"lora_name": "planner_rt"}')
check "shared: unload planner_rt: 200 (got $code)" [ "$code" = 200 ]
code=$(post s_gone "$(body ', "adapter": "planner_rt"')")
check "shared: planner_rt now 404 (got $code)" [ "$code" = 404 ]
code=$(admin s_unknown unload_lora_adapter '{"lora_name": "nope"}')
check "shared: unloading an unknown name: 404 JSON (got $code)" [ "$code" = 404 ] && is_json_error s_unknown
stop_cluster shared

# ---------------------------------------------------------------- 3. no --lora at start-up
start_cluster bare --kv-blocks 64 --device cpu --cpu-matmul fp32 --allow-runtime-lora || exit 1
check "bare: /v1/models lists no adapter" [ -z "$(models)" ]
code=$(admin b_load load_lora_adapter '{"lora_name": "coder", "lora_path": "'"$adapters/coder.gguf"'"}')
check "bare: loading coder into a server started without --lora: 200 (got $code)" [ "$code" = 200 ]
check "bare: coder 200" [ "$(post b_coder "$(body ', "adapter": "coder"')")" = 200 ]
check "bare: it answers as the --lora coder of cluster 1" [ "$(text b_coder)" = "$(text coder)" ]
stop_cluster bare

echo "$failures failed"
[ "$failures" = 0 ]
