#!/usr/bin/env bash
# KV block moves between instances (issue 19) with the real model, two one-rank instances:
#  - a request routed to the cold instance (round-robin) whose prompt instance 0 has cached is served
#    by moving the blocks over UCX: usage.prompt_tokens_details.cached_tokens_remote > 0, /metrics
#    counts the blocks and bytes moved in and lent, the events log has the planned move, and the
#    greedy answer equals the one computed from scratch;
#  - with UCX_TLS=tcp named (the default lands on TCP over loopback too on one machine: UCX 1.13 has
#    no shared-memory transport with peer error handling) the same holds, and with two ranks per instance (--tp 2:
#    shard by shard, rank i to rank i);
#  - a respawned leader takes part (--restart-instances, on the TCP cluster): with it every move
#    message goes through the coordinator (MSG_KV_RELAY); before the kill a move still lands, and
#    after instance 1's leader is killed -9 and spawned again, a move lands into the respawned
#    instance and another out of it (the events log names both directions after the restart);
#  - a frozen lender (SIGSTOP) makes the move time out: the request is recomputed on the cold
#    instance, answers the same, and the failure is counted; the lender resumes and serves again;
#  - a request routed onto blocks in flight waits for them (issue 33 (a), worker/import_followers.h):
#    with the lender frozen, a request with a pull hint parks at the cold instance and a second one
#    sharing its head but too little of it to be given a move of its own (the static cost model's
#    threshold is set to 10 blocks) follows it instead of prefilling the head; once the lender
#    resumes and the move lands, the second finds the head cached, and no move is declined; a third
#    such request whose client goes away while it waits is finished at once;
#  - --kv-moves off: the cold instance recomputes (no remote tokens, nothing moved);
#  - bad values of --kv-moves / --router are refused with a message.
# Usage: test_kv_moves.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"
# shellcheck source=rank_pid.sh
source "$root/tests/integration/rank_pid.sh"

doc=$(python3 -c 'print(" ".join(f"Clause {i}: the supplier ships part {i * 7} to depot {i % 5} within {i % 9 + 2} days." for i in range(40)))')
doc2=$(python3 -c 'print(" ".join(f"Entry {i}: the station at km {i * 3} logged {i % 7 + 1} trains and {i % 4} delays." for i in range(40)))')
doc3=$(python3 -c 'print(" ".join(f"Row {i}: the bakery on street {i * 5} sold {i % 6 + 3} loaves and {i % 8} cakes." for i in range(40)))')
body() {  # body DOCUMENT QUESTION: a chat request over a long document
  python3 -c 'import json,sys; print(json.dumps({"temperature": 0, "max_tokens": 16, "messages": [
      {"role": "system", "content": "You answer questions about the text below."}, {"role": "user", "content": sys.argv[1]},
      {"role": "user", "content": sys.argv[2]}]}))' "$1" "$2"
}
ask() {  # ask NAME QUESTION [DOCUMENT]: the answer JSON in $work/NAME.json
  curl -s -m 120 "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$(body "${3:-$doc}" "$2")" > "$work/$1.json"
}
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"d": d}))' "$@"; }
text() { field "$1" 'd["choices"][0]["message"]["content"]'; }
remote() { field "$1" 'd["usage"]["prompt_tokens_details"]["cached_tokens_remote"]'; }
cached() { field "$1" 'd["usage"]["prompt_tokens_details"]["cached_tokens"]'; }
total() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
failure_counted() { [ "$(total braid_kv_move_failures_total)" -ge 1 ]; }

# moved_case NAME: instance 0 computes the prompt, instance 1 gets it next (round-robin) and must
# move the prefix in; the answers must agree.
moved_case() {
  local name=$1
  ask "$name-first" "Which depot does part 14 go to?"
  ask "$name-moved" "Which depot does part 14 go to?"
  check "$name: first answer non-empty" [ -n "$(text "$work/$name-first.json")" ]
  check "$name: first request computed its prompt (no remote tokens)" [ "$(remote "$work/$name-first.json")" = 0 ]
  local r; r=$(remote "$work/$name-moved.json")
  check "$name: the cold instance got the prefix by a move (cached_tokens_remote $r > 256)" [ "${r:-0}" -gt 256 ]
  check "$name: the moved answer equals the computed one" [ "$(text "$work/$name-first.json")" = "$(text "$work/$name-moved.json")" ]
  check "$name: /metrics counts moved blocks" [ "$(total braid_kv_moved_in_blocks_total)" -gt 0 ]
  check "$name: /metrics counts moved bytes" [ "$(total braid_kv_moved_in_bytes_total)" -gt 0 ]
  check "$name: no move failed" [ "$(total braid_kv_move_failures_total)" = 0 ]
  check "$name: a move that landed is not a decline (braid_kv_move_declines_total 0)" [ "$(total braid_kv_move_declines_total)" = 0 ]
  check "$name: the events log has the planned move" grep -q '"event":"move_planned".*"from":0,"to":1' "$work/$name-events.jsonl"
  check "$name: the router learned the pair's measured rate (move_measured, host_ucx)" \
    grep -q '"event":"move_measured".*"from":0,"to":1.*"link":"host_ucx"' "$work/$name-events.jsonl"
}

# respawn_moves_case NAME: instance 1's leader killed -9 and spawned again (--restart-instances);
# then, round-robin alternating between the two instances, document 2 computed on one and moved
# into the other, a short filler, document 3 computed on the other and moved back: one move into
# the respawned instance and one out of it.
respawn_moves_case() {
  local name=$1 pid before r
  pid=$(rank_pid 2)
  check "$name: found instance 1's leader" [ -n "$pid" ]
  kill -KILL "$pid"
  restarted() { [ "$(total braid_instance_restarts_total)" = 1 ] && [ "$(curl -s "$url/health" |
    python3 -c 'import json, sys; h = json.load(sys.stdin); print(h["status"], h["instances_alive"])' 2> /dev/null)" = "ready 2" ]; }
  check "$name: instance 1 is respawned and ready within 120 s" wait_for 120 restarted
  before=$(wc -l < "$work/$name-events.jsonl")
  ask "$name-r1" "Which station logged the most trains?" "$doc2"
  ask "$name-r2" "Which station logged the most trains?" "$doc2"
  ask "$name-filler" "Say hi." "Hello."
  ask "$name-r3" "Which bakery sold the most cakes?" "$doc3"
  ask "$name-r4" "Which bakery sold the most cakes?" "$doc3"
  for k in 2 4; do
    r=$(remote "$work/$name-r$k.json")
    check "$name: after the respawn, move $((k / 2)) landed (cached_tokens_remote $r > 256)" [ "${r:-0}" -gt 256 ]
    check "$name: after the respawn, moved answer $((k / 2)) equals the computed one" \
      [ "$(text "$work/$name-r$((k - 1)).json")" = "$(text "$work/$name-r$k.json")" ]
  done
  tail -n +"$((before + 1))" "$work/$name-events.jsonl" > "$work/$name-after.jsonl"
  check "$name: a move into the respawned instance 1 (events log)" grep -q '"event":"move_planned".*"from":0,"to":1' "$work/$name-after.jsonl"
  check "$name: a move out of the respawned instance 1 (events log)" grep -q '"event":"move_planned".*"from":1,"to":0' "$work/$name-after.jsonl"
  check "$name: no move failed" [ "$(total braid_kv_move_failures_total)" = 0 ]
}

start_cluster default --instances 2 --router round-robin --kv-blocks 256 --threads 1 --events "$work/default-events.jsonl" --move-timeout 3
moved_case default
# Instance 0 frozen: the router still believes in it, so instance 1 is told to move from it; the
# move times out and the prompt is recomputed there.
ask warm "Which station logged the most trains?" "$doc2"  # instance 0: caches a second document
pid=$(rank_pid 1)
check "frozen: found instance 0's leader" [ -n "$pid" ]
kill -STOP "$pid"
ask frozen "Which station logged the most trains?" "$doc2"
kill -CONT "$pid"
check "frozen: the cold instance answered anyway" [ "$(text "$work/frozen.json")" = "$(text "$work/warm.json")" ]
check "frozen: nothing came from the frozen lender" [ "$(remote "$work/frozen.json")" = 0 ]
check "frozen: the failed move is counted" wait_for 5 failure_counted
ask after "Which depot does part 14 go to?"
check "frozen: the lender serves again after resuming" [ "$(text "$work/after.json")" = "$(text "$work/default-first.json")" ]
stop_cluster default

# With --restart-instances every leader relays its move messages through the coordinator.
UCX_TLS=tcp start_cluster tcp --instances 2 --router round-robin --kv-blocks 256 --threads 1 --events "$work/tcp-events.jsonl" \
  --restart-instances 1 --rewarm-heads 0 --move-timeout 30
moved_case tcp
respawn_moves_case tcp
stop_cluster tcp

# Two ranks per instance: the move goes shard by shard, rank i of the lender to rank i here.
start_cluster tp2 --instances 2 --tp 2 --router round-robin --kv-blocks 256 --threads 1 --events "$work/tp2-events.jsonl"
moved_case tp2
stop_cluster tp2

# follow_case: the static model prices a move of k blocks at k x 368,704 B / 0.1 GB/s + 2 ms and its
# recompute at k x 16 / 4116 tokens/s, so only a gain of 10 blocks or more is moved. Round-robin:
# the first request (the document) computes on instance 0; instance 0 is frozen; the same request
# goes to instance 1 with a pull hint (about 50 blocks) and parks, a filler goes to the frozen
# instance 0, and a third request sharing only the document's first clauses (about 5 blocks: no
# move of its own) goes to instance 1, where it must wait behind the parked move.
follow_case() {
  local name=$1 short r c
  short=$(python3 -c 'import sys; print(". ".join(sys.argv[1].split(". ")[:3]) + ". " + sys.argv[2])' "$doc" "$doc3")
  ask "$name-first" "Which depot does part 14 go to?"
  local pid; pid=$(rank_pid 1)
  check "$name: found instance 0's leader" [ -n "$pid" ]
  kill -STOP "$pid"
  ask "$name-moved" "Which depot does part 14 go to?" &
  local moved_pid=$!
  routed() { [ "$(grep -c '"event":"route"' "$work/$name-events.jsonl")" -ge "$1" ]; }
  wait_for 30 routed 2
  ask "$name-filler" "Say hi." "Hello." &
  local filler_pid=$!
  wait_for 30 routed 3
  ask "$name-follower" "Which bakery sold the most cakes?" "$short" &
  local follower_pid=$!
  following() { [ "$(total braid_kv_move_followers_total)" -ge 1 ] 2> /dev/null; }
  check "$name: the request sharing the head waits behind the parked move (braid_kv_move_followers_total)" wait_for 20 following
  # A second follower whose client goes away (curl -m 3) is finished at once, not when the move ends:
  # with the lender still frozen, 4 requests stay in flight (the parked one, two fillers, the first follower).
  ask "$name-filler2" "Say hello." "Hi." &
  local filler2_pid=$!
  wait_for 30 routed 5
  curl -s -m 3 "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "$(body "$short" "Which bakery sold the fewest loaves?")" > /dev/null &
  local gone_pid=$!
  following2() { [ "$(total braid_kv_move_followers_total)" -ge 2 ] 2> /dev/null; }
  check "$name: a second request sharing the head follows the same move" wait_for 20 following2
  wait "$gone_pid"
  in_flight4() { [ "$(total braid_requests_inflight)" = 4 ] 2> /dev/null; }
  check "$name: the follower whose client went away is finished while the move still waits" wait_for 30 in_flight4
  kill -CONT "$pid"
  wait "$moved_pid" "$filler_pid" "$follower_pid" "$filler2_pid"
  check "$name: the events log routes the five to instances 1, 0, 1, 0, 1" \
    [ "$(grep '"event":"route"' "$work/$name-events.jsonl" | tail -5 | sed 's/.*"instance":\([0-9]*\).*/\1/' | tr -d '\n')" = 10101 ]
  check "$name: only the first of them was given a move" [ "$(grep -c '"event":"move_planned"' "$work/$name-events.jsonl")" = 1 ]
  check "$name: the move released one follower (the other was cancelled)" [ "$(grep -c 'released after req' "$work/$name.err")" = 1 ]
  r=$(remote "$work/$name-moved.json")
  check "$name: the parked request's move landed (cached_tokens_remote $r > 256)" [ "${r:-0}" -gt 256 ]
  check "$name: the moved answer equals the computed one" [ "$(text "$work/$name-first.json")" = "$(text "$work/$name-moved.json")" ]
  c=$(cached "$work/$name-follower.json")
  check "$name: the follower found the shared head cached (cached_tokens $c >= 48), not prefilled it" [ "${c:-0}" -ge 48 ]
  check "$name: the follower answered" [ -n "$(text "$work/$name-follower.json")" ]
  check "$name: no move was declined" [ "$(total braid_kv_move_declines_total)" = 0 ]
  check "$name: no move failed" [ "$(total braid_kv_move_failures_total)" = 0 ]
  check "$name: the leader logged the follower's release" grep -q 'released after req .* move' "$work/$name.err"
}

start_cluster follow --instances 2 --router round-robin --kv-blocks 256 --threads 1 --events "$work/follow-events.jsonl" \
  --move-timeout 30 --move-gbps 0.1 --move-prefill-tps 4116
follow_case follow
stop_cluster follow

start_cluster off --instances 2 --router round-robin --kv-blocks 256 --threads 1 --kv-moves off
ask off-first "Which depot does part 14 go to?"
ask off-second "Which depot does part 14 go to?"
check "off: the cold instance recomputed (no cached or remote tokens)" [ "$(cached "$work/off-second.json")" = 0 ]
check "off: recompute answers as the move did" [ "$(text "$work/off-second.json")" = "$(text "$work/default-first.json")" ]
check "off: nothing moved" [ "$(total braid_kv_moved_in_blocks_total)" = 0 ]
stop_cluster off

"$braid" serve --model "$model" --kv-moves sometimes > /dev/null 2> "$work/bad1.err"
check "--kv-moves sometimes is refused with a message" grep -q -- "--kv-moves expects on or off" "$work/bad1.err"
"$braid" serve --model "$model" --router random > /dev/null 2> "$work/bad2.err"
check "--router random is refused with a message" grep -q -- "--router expects cost, cache, balanced or round-robin" "$work/bad2.err"

echo "$failures failure(s)"
[ "$failures" = 0 ]
