#!/usr/bin/env bash
# A workflow with a request in flight is busy, not idle (issue 35). Against a real cluster with
# --policy pbkv and --workflow-idle-timeout 1:
#  1. a workflow whose one request runs for seconds (ignore_eos, hundreds of tokens) stays active
#     (braid_workflows_active 1) more than 2 s after its call while the request runs — before the
#     fix the coordinator retired it after 1 s and sent WORKFLOW_END, so pbkv evicted its history
#     first (the live pbkv arm's 5.5-point loss to the simulator on a loaded machine);
#  2. once the request is answered, the idle timeout still retires it (active back to 0 within a
#     few seconds): the idle clock runs from the answer.
# Usage: test_workflow_idle.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"
client_pid=""
cleanup_client() { [ -n "$client_pid" ] && kill "$client_pid" 2> /dev/null; }
trap 'cleanup_client; cleanup' EXIT
active_is() { [ "$(metric braid_workflows_active)" = "$1" ]; }

start_cluster idle --instances 1 --kv-blocks 128 --policy pbkv --workflow-idle-timeout 1 || exit 1

# One long call of workflow wf-slow: 1 500 generated tokens, seconds on the CPU backend even on a quiet
# machine (500 took under 2.6 s on an idle 2-core box, too fast to tell busy from idle).
t0=$(date +%s.%N)
curl -s -o "$work/slow.json" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
  -d '{"prompt": "Write a long story about a lighthouse keeper:", "max_tokens": 1500, "ignore_eos": true, "temperature": 0,
       "workflow_id": "wf-slow", "agent": "writer"}' > "$work/slow.code" &
client_pid=$!

sleep 2.6
if ! kill -0 "$client_pid" 2> /dev/null; then
  fail "the 1500-token request finished within 2.6 s: too fast to tell busy from idle (code $(cat "$work/slow.code"))"
else
  got=$(metric braid_workflows_active)
  still=$(kill -0 "$client_pid" 2> /dev/null && echo running || echo done)
  check "a workflow with its request in flight 2.6 s after its call (idle timeout 1 s) stays active (active=$got, request $still)" \
    [ "$got" = 1 ]
fi
wait "$client_pid"; client_pid=""
check "the long call is answered 200 (got $(cat "$work/slow.code"))" [ "$(cat "$work/slow.code")" = 200 ]
check "once answered, the idle timeout retires it (braid_workflows_active back to 0)" \
  wait_for 10 active_is 0
check "the workflow still counted a forecast" [ "$(metric braid_workflow_forecasts_total)" -ge 1 ]

stop_cluster idle
echo "$failures failure(s)"
[ "$failures" = 0 ]
