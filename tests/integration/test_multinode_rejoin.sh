#!/usr/bin/env bash
# A lost worker node comes back and rejoins routing (issue 33 item 3), on three network-namespace
# nodes (tests/multinode/nodes.sh). Open MPI 4.1.4 cannot bring a lost node back into a running
# mpirun job, and connects two jobs only when every process of each runs on its own mpirun's node
# (docs/ARCHITECTURE.md "Nodes and a lost node"), so the layout is one MPI job per node, started
# by `launch/braid-local --nodes 3 --joinable` (on the nodes this test made):
#  - ompi-server (the name service) in the root namespace, on the node subnet;
#  - node 1: the coordinator's job, `mpirun -n 2` inside the node (rank 0 + instance 0), with
#    `--join-slots 2`: instances 1 and 2 have no rank in it and start dead, awaiting a join;
#  - nodes 2 and 3: `mpirun -n 1 braid serve --join-instance 1|2` inside each node;
# and a joiner again is `launch/braid-local --rejoin-node J`.
# Checked:
#  - both joiners are taken: /health "ready" with 3 of 3 instances up; a third joiner asking for
#    instance 1 (alive) is refused and says why, and nothing changes;
#  - joined instances lend and borrow KV blocks: one long prompt asked three times (round-robin)
#    is computed once and moved in by the other two instances; at least one borrower is a joined
#    instance with cached_tokens_remote > 256, /metrics counts the moved bytes, no move fails, and
#    the borrower's node link carried at least those bytes in (the UCX reads crossed the veth);
#  - node 3 is lost under load (every process in it killed, its link down): the whole answers in
#    flight all complete (200), /health says "degraded" with instance 2 dead (its leader's silence,
#    --instance-timeout);
#  - the link comes back and a new `mpirun` job on node 3 joins as instance 2: /health is "ready"
#    again, /metrics counts the restart and the re-warm (braid_instance_rewarms_total), and requests routed round-robin reach instance 2 and are
#    answered (the coordinator's routing events name instance 2 for a request answered 200 after
#    the rejoin);
#  - after the rejoin a second document asked three times moves into or out of instance 2 (the new
#    leader's UCX worker replaces the old one's behind the same leader rank);
#  - SIGTERM to the launcher drains the coordinator and the launcher exits 0 (the server's
#    status), stopping every job and ompi-server (nothing left on the nodes, no state left).
# Every exit path (EXIT, INT, TERM) kills the processes this test started and removes the nodes.
# Needs root, ip netns, unshare, nsenter, mpirun and ompi-server: exits 77 (skipped) without them.
# Its own set of nodes (prefix bmr, 10.231.78.0/24), so it runs beside other multi-node tests.
# Usage: test_multinode_rejoin.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
nodes_sh=$root/tests/multinode/nodes.sh
export BRAID_NODES_PREFIX=bmr BRAID_NODES_NET=10.231.78
net=$BRAID_NODES_NET

skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network and mount namespaces)"
for tool in ip unshare nsenter mpirun ompi-server curl python3; do command -v "$tool" > /dev/null || skip "$tool not found"; done
probe=bmr-probe-$$
ip netns add "$probe" 2> /dev/null || skip "ip netns add fails here (no network namespaces)"
ip netns del "$probe"
unshare --mount --uts true 2> /dev/null || skip "unshare --mount --uts fails here"
[ "$("$nodes_sh" count)" = 0 ] || "$nodes_sh" down  # a set left by a killed run of this test

work=$(mktemp -d)
pids=()  # every process this test started (mpirun jobs, ompi-server, curl clients)
cleanup() {
  local p
  for p in "${pids[@]+"${pids[@]}"}"; do kill -KILL "$p" 2> /dev/null; done
  "$nodes_sh" down  # also kills what is left inside the nodes (the ranks of the jobs above)
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # the EXIT trap then cleans up
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do echo "--- $f"; grep -v '^\s*$' "$f" | tail -n 25; done
  exit 1
}

"$nodes_sh" up 3 || fail "nodes.sh up 3"
export BRAID_BIN=$braid
serve=(--model "$model" --threads 1 --kv-blocks 256 --max-batch-tokens 128 --instance-timeout 8 --router round-robin)
url=http://$net.1:8000
"$root/launch/braid-local" --nodes 3 --joinable "${serve[@]}" --port 8000 --events "$work/events.jsonl" > "$work/launcher.log" 2>&1 &
launcher=$!
pids+=($launcher)
rejoin() {  # rejoin NODE LOG: a new joining job for the node (instance NODE-1), in the background
  "$root/launch/braid-local" --rejoin-node "$1" > "$work/$2" 2>&1 &
  pids+=($!)
}
health() { curl -s -m 5 "$url/health"; }
status() { health | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2> /dev/null; }
state_of() { health | python3 -c 'import json,sys; print(json.load(sys.stdin)["instance_states"][int(sys.argv[1])]["state"])' "$1" 2> /dev/null; }
wait_for() {  # wait_for SECONDS CMD...: until CMD succeeds
  local t=$1 i
  shift
  for i in $(seq 1 "$t"); do "$@" && return 0; sleep 1; done
  return 1
}
up0() { [ "$(state_of 0)" = up ]; }
ready() { [ "$(status)" = ready ]; }
degraded2() { [ "$(status)" = degraded ] && [ "$(state_of 2)" = dead ]; }
ask() {  # ask NAME TEXT: a whole answer into NAME.json, its HTTP status into NAME.code
  curl -s -m 120 -o "$work/$1.json" -w '%{http_code}' "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d "{\"max_tokens\": 12, \"messages\": [{\"role\": \"user\", \"content\": \"$2\"}]}" > "$work/$1.code"
}

wait_for 90 up0 || fail "the coordinator's own instance did not come up"
wait_for 90 ready || fail "the two joining instances were not taken: $(health)"
echo "ok: instances 1 and 2 joined from their own MPI jobs on nodes 2 and 3: $(health | head -c 200)"
# A joiner for an instance that is up is refused (and says so), and changes nothing.
rejoin 2 refused-joiner.log
refused() { grep -q "refused instance 1" "$work/refused-joiner.log"; }
wait_for 60 refused || fail "a joiner for live instance 1 was not refused"
ready || fail "a refused joiner changed the state: $(health)"
echo "ok: a joiner for a live instance is refused: $(grep -o 'the coordinator refused.*' "$work/refused-joiner.log" | head -n 1)"

# Joined instances lend and borrow KV blocks: the same long prompt three times, round-robin, reaches
# every instance; the first computes it, the other two move it in over UCX (their move messages
# relayed by the coordinator, MSG_KV_RELAY), and at least one of those two is a joined instance.
metric() { curl -s -m 5 "$url/metrics" | sed -n "s/^$1 \([0-9]*\).*/\1/p"; }
counter() { cat "/sys/class/net/$("$nodes_sh" veth "$1")/statistics/tx_bytes"; }  # bytes into node N
doc=$(python3 -c 'print(" ".join(f"Clause {i}: the supplier ships part {i * 7} to depot {i % 5} within {i % 9 + 2} days." for i in range(40)))')
ask_doc() {  # ask_doc NAME [DOCUMENT]: a chat request over the document, answered whole into NAME.json
  python3 -c 'import json,sys; print(json.dumps({"temperature": 0, "max_tokens": 8, "messages": [
      {"role": "system", "content": "You answer questions about the text below."}, {"role": "user", "content": sys.argv[1]},
      {"role": "user", "content": "Which depot does part 14 go to?"}]}))' "${2:-$doc}" > "$work/$1.body"
  curl -s -m 120 -o "$work/$1.json" -w '%{http_code}' "$url/v1/chat/completions" -H 'Content-Type: application/json' \
    -d @"$work/$1.body" > "$work/$1.code"
}
served_by() {  # served_by NAME: the instance the routing events name for NAME.json's request
  python3 - "$work/events.jsonl" "$work/$1.json" << 'EOF2'
import json, sys
req = int(json.load(open(sys.argv[2]))["id"].rsplit("-", 1)[1])
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("event") == "route" and e.get("req") == req:
        print(e.get("instance"))
EOF2
}
remote() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens_details"]["cached_tokens_remote"])' "$1" 2> /dev/null; }
joined_borrowed=0
for k in 1 2 3; do
  moved0=$(metric braid_kv_moved_in_bytes_total) in2=$(counter 2) in3=$(counter 3)
  ask_doc "doc$k"
  [ "$(cat "$work/doc$k.code")" = 200 ] || fail "document request $k: HTTP $(cat "$work/doc$k.code") $(cat "$work/doc$k.json")"
  sleep 1  # the leaders' statistics (moved bytes) reach /metrics every 0.1 s
  moved=$(($(metric braid_kv_moved_in_bytes_total) - moved0))
  inst=$(served_by "doc$k" | tail -n 1) r=$(remote "$work/doc$k.json")
  echo "document request $k: instance ${inst:-?}, cached_tokens_remote ${r:-?}, moved bytes $moved," \
    "into node 2 $(($(counter 2) - in2)), into node 3 $(($(counter 3) - in3))"
  if [ "${inst:-0}" -ge 1 ] && [ "${r:-0}" -gt 256 ] && [ "$moved" -gt 0 ]; then
    into=$(($(counter $((inst + 1))) - $([ "$inst" = 1 ] && echo "$in2" || echo "$in3")))
    [ "$into" -ge "$moved" ] || fail "joined instance $inst moved $moved bytes in but its node's link carried only $into in"
    joined_borrowed=$((joined_borrowed + 1))
  fi
done
[ "$joined_borrowed" -ge 1 ] || fail "no joined instance moved the document's prefix in (events: $(grep -c move_planned "$work/events.jsonl") moves planned)"
[ "$(metric braid_kv_move_failures_total)" = 0 ] || fail "a move failed: braid_kv_move_failures_total $(metric braid_kv_move_failures_total)"
echo "ok: $joined_borrowed joined instance(s) borrowed the prefix over UCX across the veth links (braid_kv_moved_in_bytes_total $(metric braid_kv_moved_in_bytes_total))"

# Node 3 lost under load.
for k in 1 2 3 4 5 6; do ask "load$k" "Load request $k: name three colours." & pids+=($!); done
sleep 1
node3=$(ip netns pids bmr-n3)
# shellcheck disable=SC2086
[ -n "$node3" ] && kill -KILL $node3
ip link set "$("$nodes_sh" veth 3)" down
wait_for 40 degraded2 || fail "node 3's loss was not seen: $(health)"
echo "ok: node 3 lost: $(health | head -c 240)"
for k in 1 2 3 4 5 6; do
  wait_for 120 test -s "$work/load$k.code" || fail "load request $k never ended"
  [ "$(cat "$work/load$k.code")" = 200 ] || fail "load request $k: HTTP $(cat "$work/load$k.code") $(cat "$work/load$k.json")"
done
echo "ok: the 6 whole answers in flight all completed (200)"

# The node comes back: link up, a new job on it joins as instance 2.
ip link set "$("$nodes_sh" veth 3)" up
rejoin 3 rejoiner-node3.log
wait_for 90 ready || fail "instance 2 did not rejoin: $(health)"
echo "ok: node 3 rejoined: $(health | head -c 200)"
restarts=$(curl -s -m 5 "$url/metrics" | sed -n 's/^braid_instance_restarts_total \([0-9]*\)/\1/p')
[ "${restarts:-0}" -ge 3 ] || fail "braid_instance_restarts_total = '$restarts', want >= 3 (two first joins and the rejoin)"
rewarmed() { [ "$(metric braid_instance_rewarms_total)" -ge 3 ] 2> /dev/null; }
wait_for 60 rewarmed || fail "braid_instance_rewarms_total = '$(metric braid_instance_rewarms_total)', want >= 3 (each join re-warms)"
echo "ok: re-warmed (braid_instance_rewarms_total $(metric braid_instance_rewarms_total), heads $(metric braid_instance_rewarm_heads_total))"
after=()
for k in 1 2 3 4 5 6; do
  ask "after$k" "After the rejoin, request $k: count to $k." || true
  [ "$(cat "$work/after$k.code")" = 200 ] || fail "request $k after the rejoin: HTTP $(cat "$work/after$k.code") $(cat "$work/after$k.json")"
  after+=("$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["id"].rsplit("-", 1)[1])' "$work/after$k.json")")
done

# The rejoined instance (a new UCX worker behind the same leader rank) takes part in moves again: a
# second document three times round-robin; a move into or out of instance 2 lands.
doc=$(python3 -c 'print(" ".join(f"Entry {i}: the station at km {i * 3} logged {i % 7 + 1} trains and {i % 4} delays." for i in range(40)))')
moved_before=$(metric braid_kv_moved_in_bytes_total) failures_before=$(metric braid_kv_move_failures_total)
rejoined_moved=0
for k in 1 2 3; do
  ask_doc "redoc$k"
  [ "$(cat "$work/redoc$k.code")" = 200 ] || fail "second document, request $k: HTTP $(cat "$work/redoc$k.code") $(cat "$work/redoc$k.json")"
  inst=$(served_by "redoc$k" | tail -n 1) r=$(remote "$work/redoc$k.json")
  from=$(python3 - "$work/events.jsonl" "$work/redoc$k.json" << 'EOF2'
import json, sys
req = int(json.load(open(sys.argv[2]))["id"].rsplit("-", 1)[1])
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("event") == "move_planned" and e.get("req") == req:
        print(e.get("from"))
EOF2
)
  echo "second document, request $k: instance ${inst:-?}, moved from ${from:-none}, cached_tokens_remote ${r:-?}"
  if [ "${r:-0}" -gt 256 ] && { [ "${inst:-}" = 2 ] || [ "${from:-}" = 2 ]; }; then rejoined_moved=$((rejoined_moved + 1)); fi
done
sleep 1
[ "$rejoined_moved" -ge 1 ] || fail "no move into or out of the rejoined instance 2 landed"
[ "$(metric braid_kv_moved_in_bytes_total)" -gt "$moved_before" ] || fail "no bytes moved after the rejoin"
[ "$(metric braid_kv_move_failures_total)" = "$failures_before" ] || fail "a move failed after the rejoin: $(metric braid_kv_move_failures_total)"
echo "ok: the rejoined instance 2 lends or borrows again ($rejoined_moved move(s) landed with it)"

# SIGTERM to the launcher: drain and exit 0; the events file is complete then.
kill -TERM "$launcher"
gone() { ! kill -0 "$launcher" 2> /dev/null; }
wait_for 60 gone || fail "the launcher did not exit on SIGTERM"
wait "$launcher"; rc=$?
[ "$rc" = 0 ] || fail "launcher exit status $rc"
for n in 1 2 3; do [ -z "$(ip netns pids "bmr-n$n")" ] || fail "processes left on node $n after the launcher ended"; done
[ ! -e /run/braid-join/bmr ] || fail "the launcher left its state in /run/braid-join/bmr"
echo "ok: SIGTERM drained the coordinator, the launcher exited 0 and left nothing running on the nodes"
served=$(python3 - "$work/events.jsonl" "${after[@]}" << 'EOF'
import json, sys
wanted = set(int(x) for x in sys.argv[2:])
hits = 0
for line in open(sys.argv[1]):
    try:
        e = json.loads(line)
    except ValueError:
        continue
    if e.get("event") == "route" and e.get("req") in wanted and e.get("instance") == 2:
        hits += 1
print(hits)
EOF
)
[ "${served:-0}" -ge 1 ] || fail "no request after the rejoin was routed to instance 2 (routing events: $(grep -c route "$work/events.jsonl"))"
echo "ok: $served of 6 requests after the rejoin were routed to instance 2 and answered (200)"
echo "PASS"
