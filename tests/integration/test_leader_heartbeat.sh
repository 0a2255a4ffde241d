#!/usr/bin/env bash
# Integration test: a leader stays alive to the coordinator through a step longer than
# --instance-timeout (the heartbeat between a forward's layers, instance_leader.c leader_step_pulse).
#   tests/integration/test_leader_heartbeat.sh BRAID_BINARY MODEL
# A step's length depends on the machine and its load, so the test measures it first:
# 1. 1 + 1x1 ranks, --instance-timeout 120: one prompt of ~1000 tokens in one step
#    (--max-batch-tokens 2048); its time E is about one prefill step.
# 2. The same cluster with --instance-timeout E/4 (at least 0.3 s): the step outlasts the timeout
#    four times over while each of its 30 layers takes ~E/30, so without the heartbeat the instance
#    is declared dead mid-prefill (a 503) and /health says "failed". Asserts: 200 with its tokens,
#    no instance failure counted, /health still "ready".
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

# ~1000 tokens of varied text, a new cluster each time (nothing cached)
prompt=$(python3 -c 'print(" ".join(f"Item {i} is a {w} number with {i % 7} friends." for i, w in zip(range(75), ["odd", "even"] * 40)))')
body=$(python3 -c 'import json, sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 2, "temperature": 0, "ignore_eos": True}))' "$prompt")

# long_request NAME -> prints "CODE SECONDS"; the body lands in $work/NAME.body
long_request() {
  local t0 t1 code
  t0=$(date +%s.%N)
  code=$(curl -s --max-time 600 -o "$work/$1.body" -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' -d "$body")
  t1=$(date +%s.%N)
  echo "$code $(python3 -c "print(round($t1 - $t0, 2))")"
}

start_cluster calibrate --instances 1 --kv-blocks 512 --max-batch-tokens 2048 --instance-timeout 120 || exit 1
read -r code step_s < <(long_request calibrate)
prompt_tokens=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens"])' "$work/calibrate.body" 2> /dev/null)
check "calibration: 200 (got $code) in one step (${prompt_tokens:-no} prompt tokens <= 2048)" \
  [ "$code" = 200 ] && [ "${prompt_tokens:-9999}" -le 2048 ] && [ "${prompt_tokens:-0}" -ge 700 ]
stop_cluster calibrate

timeout_s=$(python3 -c "print(max(0.3, round($step_s / 4, 2)))")
echo "one ~${prompt_tokens}-token prefill step: $step_s s; --instance-timeout $timeout_s"
start_cluster heartbeat --instances 1 --kv-blocks 512 --max-batch-tokens 2048 --instance-timeout "$timeout_s" || exit 1
read -r code elapsed < <(long_request heartbeat)
echo "with the timeout: HTTP $code in $elapsed s"
check "a step longer than --instance-timeout still answers 200 (got $code)" [ "$code" = 200 ]
[ "$code" = 200 ] || { cat "$work/heartbeat.body"; echo; grep -E "died|error" "$work/heartbeat.err" | head -5; }
check "no instance failure counted" [ "$(metric braid_instance_failures_total)" = 0 ]
check "/health still ready" [ "$(curl -s "$url/health" | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])')" = ready ]
stop_cluster heartbeat
[ "$failures" = 0 ] && echo "PASS" || { echo "FAILED: $failures"; exit 1; }
