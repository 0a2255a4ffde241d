#!/usr/bin/env bash
# Integration test: a restarted instance comes back warm (issue 22, point 1). Real mpirun ranks, real HTTP.
#   tests/integration/test_instance_rewarm.sh BRAID_BINARY MODEL
# 1 + 1x1 ranks with --restart-instances 1, so every request after the restart runs on the
# restarted instance. Three distinct long prompts are sent twice each (their chunks count 2 in the
# coordinator's recorder), a fourth only once (count 1: below the re-warm threshold). kill -9 of the
# instance's leader: it is spawned again, and once ready the coordinator prefills the recorded hot
# heads on it in the background. /metrics counts one re-warm of 3 heads; each hot prompt then gets
# usage.prompt_tokens_details.cached_tokens > 0 on the new leader, the once-seen prompt 0 (the new
# leader's cache started empty: only the re-warm filled it). A second cluster with --rewarm-heads 1
# shows the bound: one head re-warmed, the next hot prompt finds nothing cached.
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"
# shellcheck source=rank_pid.sh
source "$root/tests/integration/rank_pid.sh"

# prompt K: a long prompt of its own (deterministic pseudo-random words, so no chunk of one prompt
# recurs in another and each prompt chains into one head).
prompt() {
  python3 -c '
import random, sys
words = ("river stone lantern orchard copper meadow violin harbor pepper glacier thunder willow saddle "
         "marble falcon quartz ember tulip canyon velvet compass juniper anchor bramble cobalt dune "
         "fjord garnet hazel ivory jasmine kettle lilac mosaic nectar onyx pebble quill rustle sparrow "
         "timber umber vessel wren yarrow zephyr acorn beacon cinder dapple eddy fern grove").split()
r = random.Random(int(sys.argv[1]))
print(" ".join(r.choice(words) for _ in range(90)))' "$1"
}
# cached K -> cached_tokens of one completion of prompt K (max_tokens 1), or "error ..."
cached() {
  local body="$work/prompt.$1.json"
  python3 -c 'import json, sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 1, "temperature": 0}))' "$(prompt "$1")" > "$body"
  curl -s --max-time 120 "$url/v1/completions" -H 'Content-Type: application/json' -d @"$body" |
    python3 -c 'import json, sys
r = json.load(sys.stdin)
print(r["usage"]["prompt_tokens_details"]["cached_tokens"] if "usage" in r else "error " + json.dumps(r)[:200])'
}
back() { [ "$(curl -s "$url/health" | python3 -c 'import json, sys; h = json.load(sys.stdin); print(h["status"], h["instances_alive"])' 2> /dev/null)" = "ready 1" ]; }
rewarmed() { [ "$(metric braid_instance_rewarms_total)" = 1 ]; }

# kill_and_rewarm NAME: sends prompts 1-3 twice and 4 once, kills the only instance's leader, waits
# for its restart and the end of its re-warm.
kill_and_rewarm() {
  for k in 1 2 3 1 2 3 4; do cached "$k" > /dev/null; done
  check "$1: the recorder counts 3 hot heads' chunks twice" \
    [ "$(curl -s "$url/v1/cache/manifest?min_count=2" | grep -c '"content_hash"')" -ge 3 ]
  kill -KILL "$(rank_pid 1)"
  gone_503() { [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 503 ]; }
  check "$1: the only instance died (/health 503)" wait_for 10 gone_503
  check "$1: it is back within 60 s (/health ready, 1 alive)" wait_for 60 back
  check "$1: its re-warm finished within 60 s (braid_instance_rewarms_total 1)" wait_for 60 rewarmed
}

# ---------------------------------------------------------------- 1: hot heads come back
start_cluster rewarm --instances 1 --restart-instances 1 || exit 1
check "no re-warm before any restart" [ "$(metric braid_instance_rewarms_total)" = 0 ]
kill_and_rewarm rewarm
check "/metrics: 3 heads re-warmed" [ "$(metric braid_instance_rewarm_heads_total)" = 3 ]
check "/metrics: their prompt tokens counted" [ "$(metric braid_instance_rewarm_prompt_tokens_total)" -gt 150 ]
check "the log shows the re-warm's progress and end" \
  bash -c "grep -q 'instance 0 re-warm: 3/3 heads' '$work/rewarm.err' && grep -q 'instance 0 re-warm done in' '$work/rewarm.err'"
for k in 1 2 3; do
  c=$(cached "$k")
  check "hot prompt $k on the restarted instance: cached_tokens > 0 ($c)" [ "$c" -gt 0 ] 2> /dev/null
done
c=$(cached 4)
check "the prompt seen once was not re-warmed: cached_tokens 0 ($c)" [ "$c" = 0 ]
stop_cluster rewarm

# ---------------------------------------------------------------- 2: the bound
start_cluster bounded --instances 1 --restart-instances 1 --rewarm-heads 1 || exit 1
kill_and_rewarm bounded
check "--rewarm-heads 1: 1 head re-warmed" [ "$(metric braid_instance_rewarm_heads_total)" = 1 ]
check "the log says 2 heads were left out" grep -q "instance 0 re-warm done in .* 2 left out" "$work/bounded.err"
hits=0
for k in 1 2 3; do c=$(cached "$k"); [ "$c" -gt 0 ] 2> /dev/null && hits=$((hits + 1)); done
check "exactly one hot prompt finds its head cached ($hits)" [ "$hits" = 1 ]
stop_cluster bounded

echo "$failures failure(s)"
[ "$failures" = 0 ]
