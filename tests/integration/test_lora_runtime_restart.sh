#!/usr/bin/env bash
# Integration test: an adapter loaded at run time survives an instance restart (issue 32 gap:
# coord/lora_roster.h). One instance, --restart-instances 1, no --lora at start-up,
# --allow-runtime-lora. coder.gguf is loaded at run time as "coder_rt" and answers; then the
# instance's leader is killed (-9); the coordinator spawns a new leader, which starts with no
# run-time adapter, and sends it coder_rt again before it takes requests: once /health says the
# instance is back, coder_rt answers 200 with the same greedy text as before the restart (without
# the replay it is an "unknown LoRA adapter" error), and an adapter unloaded before the restart is
# not brought back (404 stays 404).
#   tests/integration/test_lora_runtime_restart.sh BRAID_BINARY MODEL
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
adapters=$root/adapters
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"
# shellcheck source=rank_pid.sh
source "$root/tests/integration/rank_pid.sh"
json_get() {  # json_get FILE EXPR: evaluates EXPR with d = the file's JSON
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2> /dev/null
}
admin() {  # admin NAME ENDPOINT BODY: writes $work/NAME.json, prints the status
  curl -s -o "$work/$1.json" -w '%{http_code}' "$url/v1/$2" -H 'Content-Type: application/json' -d "$3"
}
post() {  # post NAME ADAPTER: a greedy completion with that adapter; writes $work/NAME.json, prints the status
  curl -s -o "$work/$1.json" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "The team builds a small inventory service. The first task is", "max_tokens": 8, "temperature": 0, "adapter": "'"$2"'"}'
}
text() { json_get "$work/$1.json" 'd["choices"][0]["text"]'; }

start_cluster restart --instances 1 --restart-instances 1 --kv-blocks 128 --device cpu --cpu-matmul fp32 --allow-runtime-lora || exit 1
code=$(admin load load_lora_adapter '{"lora_name": "coder_rt", "lora_path": "'"$adapters/coder.gguf"'"}')
check "load coder_rt at run time: 200 (got $code)" [ "$code" = 200 ]
code=$(admin load2 load_lora_adapter '{"lora_name": "gone_rt", "lora_path": "'"$adapters/planner.gguf"'"}')
check "load gone_rt: 200 (got $code)" [ "$code" = 200 ]
code=$(admin unload2 unload_lora_adapter '{"lora_name": "gone_rt"}')
check "unload gone_rt: 200 (got $code)" [ "$code" = 200 ]
check "coder_rt before the restart: 200" [ "$(post before coder_rt)" = 200 ]
check "... with text" [ -n "$(text before)" ]
leader=$(rank_pid 1)
check "the instance's leader is rank 1 (pid $leader)" [ -n "$leader" ]
kill -KILL "$leader"
alive() { curl -s "$url/health" | python3 -c 'import json, sys; h = json.load(sys.stdin); sys.exit(0 if h["instances_alive"] == 1 else 1)' 2> /dev/null; }
down() { ! alive; }
check "the instance is seen down" wait_for 30 down
check "it is back within 60 s" wait_for 60 alive
code=$(post after coder_rt)
check "coder_rt after the restart: 200 (got $code: $(head -c 300 "$work/after.json"))" [ "$code" = 200 ]
check "... the same greedy answer as before the restart" [ "$(text after)" = "$(text before)" ]
check "the coordinator says it sent the run-time adapter again" grep -q "loading its 1 run-time adapter(s) again" "$work/restart.err"
code=$(post gone gone_rt)
check "the adapter unloaded before the restart stays gone: 404 (got $code)" [ "$code" = 404 ]
stop_cluster restart

echo "$failures failed"
[ "$failures" = 0 ]
