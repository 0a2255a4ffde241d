#!/usr/bin/env bash
# A multi-node layout on one machine (issue 33): launch/braid-local --nodes 3 makes three "nodes"
# (network namespaces with their own hostname, /dev/shm and veth link; tests/multinode/nodes.sh), puts
# the coordinator on node 1 and one instance on each of nodes 2 and 3, and serves HTTP on node 1's
# address from the root namespace. Checked:
#  - the ranks run on different hosts (each rank logs its node's hostname) and each node has its own
#    /dev/shm (a file made on one node is not seen on the other);
#  - chat requests are answered; with --router round-robin the second request over a document goes
#    to the other instance, which moves the prefix in over UCX (cached_tokens_remote > 0, the same
#    greedy answer), and the moved bytes (braid_kv_moved_in_bytes_total) crossed the veth links: the
#    lending node's link carried at least that many bytes out and the borrowing node's link at least
#    that many in (/sys/class/net/<veth>/statistics, read before and after);
#  - losing node 3 under load (every process in it killed: its Open MPI daemon and rank; its link
#    down): /health says degraded with instance 1 dead (--instance-timeout: from another host only
#    the leader's silence shows a death), the whole answers in flight complete (routed again to
#    node 2), every stream ends, the one that had tokens from node 3 with an error event naming
#    instance 1; node 3's cached document is computed on node 2 afterwards with no move from the
#    lost node planned or failed (the registry forgot its blocks);
#  - SIGTERM drains and exits 0, leaves no rank behind, and the launcher removes the nodes it made.
# Not covered: the node coming back (Open MPI 4.1.4: MPI_Comm_spawn after a lost daemon mostly hangs).
# Every exit path (EXIT, INT, TERM) kills what is left and removes the nodes. Needs root, ip netns,
# unshare and nsenter: exits 77 (skipped) without them. A set of nodes of its own (prefix bmt,
# 10.231.77.0/24), so it runs beside nodes made by hand or by a benchmark.
# Usage: test_multinode.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
nodes_sh=$root/tests/multinode/nodes.sh
export BRAID_NODES_PREFIX=bmt BRAID_NODES_NET=10.231.77

skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network and mount namespaces)"
for tool in ip unshare nsenter mpirun; do command -v "$tool" > /dev/null || skip "$tool not found"; done
probe=bmt-probe-$$
ip netns add "$probe" 2> /dev/null || skip "ip netns add fails here (no network namespaces)"
ip netns del "$probe"
unshare --mount --uts true 2> /dev/null || skip "unshare --mount --uts fails here"
[ "$("$nodes_sh" count)" = 0 ] || "$nodes_sh" down  # a set left by a killed run of this test

work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"
trap 'cleanup; "$nodes_sh" down' EXIT
trap 'exit 1' INT TERM  # the EXIT trap then cleans up

doc2=$(python3 -c 'print(" ".join(f"Entry {i}: the station at km {i * 3} logged {i % 7 + 1} trains and {i % 4} delays." for i in range(40)))')
doc=$(python3 -c 'print(" ".join(f"Clause {i}: the supplier ships part {i * 7} to depot {i % 5} within {i % 9 + 2} days." for i in range(40)))')
body() {  # body QUESTION: a chat request over the document
  python3 -c 'import json,sys; print(json.dumps({"temperature": 0, "max_tokens": 16, "messages": [
      {"role": "system", "content": "You answer questions about the text below."}, {"role": "user", "content": sys.argv[1]},
      {"role": "user", "content": sys.argv[2]}]}))' "$doc" "$1"
}
ask() { curl -s -m 120 "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$(body "$2")" > "$work/$1.json"; }
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"d": d}))' "$@" 2> /dev/null; }
text() { field "$1" 'd["choices"][0]["message"]["content"]'; }
remote() { field "$1" 'd["usage"]["prompt_tokens_details"]["cached_tokens_remote"]'; }
counter() { cat "/sys/class/net/$("$nodes_sh" veth "$1")/statistics/$2"; }  # counter NODE rx_bytes|tx_bytes

# A leader is silent while it runs an engine step, and a busy CI machine can make an 888-token
# prefill step take longer than --instance-timeout: small steps (--max-batch-tokens 128) keep its
# messages coming, so only the lost node's instance goes silent.
port=$(free_port)
node1=$("$nodes_sh" addr 1)
url=http://$node1:$port
BRAID_BIN=$braid setsid "$root/launch/braid-local" --nodes 3 --model "$model" --port "$port" --router round-robin \
  --kv-blocks 256 --threads 1 --move-timeout 10 --max-batch-tokens 128 --instance-timeout 20 --events "$work/events.jsonl" \
  > "$work/serve.out" 2> "$work/serve.err" &
launcher_pid=$!
if wait_ready; then ok "3 nodes: ready at $url"; else fail "3 nodes: never became ready"; cat "$work/serve.err"; exit 1; fi

check "the launcher made 3 nodes" [ "$("$nodes_sh" count)" = 3 ]
check "rank 1 runs on node 2 (its own hostname)" grep -q "rank 1 (worker .* on bmt-n2)" "$work/serve.err"
check "rank 2 runs on node 3 (its own hostname)" grep -q "rank 2 (worker .* on bmt-n3)" "$work/serve.err"
"$nodes_sh" exec 2 touch /dev/shm/braid-multinode-probe
check "node 3 does not see node 2's /dev/shm" "$nodes_sh" exec 3 test ! -e /dev/shm/braid-multinode-probe
check "the root namespace does not see node 2's /dev/shm" test ! -e /dev/shm/braid-multinode-probe
check "node 2 sees its own /dev/shm" "$nodes_sh" exec 2 test -e /dev/shm/braid-multinode-probe

# Instance 0 is on node 2, instance 1 on node 3; round-robin sends the first request to instance 0
# (it computes the prompt) and the second to instance 1 (it moves the prefix in from node 2).
ask first "Which depot does part 14 go to?"
lender_out0=$(counter 2 rx_bytes) borrower_in0=$(counter 3 tx_bytes)
ask moved "Which depot does part 14 go to?"
lender_out1=$(counter 2 rx_bytes) borrower_in1=$(counter 3 tx_bytes)
moved_bytes=$(metric braid_kv_moved_in_bytes_total)
check "first answer non-empty" [ -n "$(text "$work/first.json")" ]
r=$(remote "$work/moved.json")
check "node 3's instance moved the prefix in from node 2 (cached_tokens_remote ${r:-none} > 256)" [ "${r:-0}" -gt 256 ]
check "the moved answer equals the computed one" [ "$(text "$work/first.json")" = "$(text "$work/moved.json")" ]
check "no move failed" [ "$(metric braid_kv_move_failures_total)" = 0 ]
check "/metrics counts moved bytes (${moved_bytes:-none})" [ "${moved_bytes:-0}" -gt 0 ]
out=$((lender_out1 - lender_out0)) in=$((borrower_in1 - borrower_in0))
check "node 2's link carried the moved bytes out ($out >= ${moved_bytes:-?})" [ "$out" -ge "${moved_bytes:-0}" ]
check "node 3's link carried the moved bytes in ($in >= ${moved_bytes:-?})" [ "$in" -ge "${moved_bytes:-0}" ]
# A few more requests, spread over both nodes.
for q in 1 2 3; do ask "more$q" "Which depot does part $((q * 7)) go to?"; done
all_answered() { local q; for q in 1 2 3; do [ -n "$(text "$work/more$q.json")" ] || return 1; done; }
check "three more requests answered" all_answered

# --- Losing node 3 under load -------------------------------------------------------------
# Instance 1 (node 3) caches a second document only it has seen (round-robin: the 6th request).
doc=$doc2 ask warm2 "Which station logged the most trains?"
check "the second document was routed to node 3's instance" \
  bash -c '[ "$(tail -n 1 "$1" | python3 -c "import json,sys; print(json.load(sys.stdin)[\"instance\"])")" = 1 ]' _ "$work/events.jsonl"
failures_before=$(metric braid_kv_move_failures_total)
# Load: two streams and two whole answers, one of each on either node (round-robin).
load() {  # load NAME STREAM
  curl -s -N -m 120 "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "{\"max_tokens\": 150, \"temperature\": 0,
    \"stream\": $2, \"messages\": [{\"role\": \"user\", \"content\": \"Tell me a long story about the number $1.\"}]}" > "$work/$1.out"
}
load_pids=()
for name in s1 s2; do load "$name" true & load_pids+=($!); done
sleep 0.5  # the streams first: one on each node
for name in w1 w2; do load "$name" false & load_pids+=($!); done
# A stream whose first token went out cannot be routed again (one that sent nothing yet is): wait
# for a token on both.
streams_started() { grep -q '"content":"[^"]' "$work/s1.out" 2> /dev/null && grep -q '"content":"[^"]' "$work/s2.out" 2> /dev/null; }
check "both streams sent tokens before the loss" wait_for 60 streams_started
# The node is lost: every process in it killed (its Open MPI daemon and rank), its link down.
lost_pids=$(ip netns pids "$BRAID_NODES_PREFIX-n3")
# shellcheck disable=SC2086
kill -KILL $lost_pids
ip link set "$("$nodes_sh" veth 3)" down
degraded() { curl -s -m 2 "$url/health" | grep -q '"status":"degraded".*"instance":1,"state":"dead"'; }
check "/health says degraded, instance 1 dead (within --instance-timeout 20 + 20 s)" wait_for 40 degraded
for p in "${load_pids[@]}"; do wait "$p"; done
whole_answered() { local w; for w in w1 w2; do [ -n "$(text "$work/$w.out")" ] || return 1; done; }
check "both whole answers in flight completed (200, text)" whole_answered
check "the lost instance's whole answer was routed again to node 2" grep -q "routed again to instance 0" "$work/serve.err"
stream_ended() { tail -n 3 "$1" | grep -q '^data: \[DONE\]'; }
check "stream 1 ended ([DONE])" stream_ended "$work/s1.out"
check "stream 2 ended ([DONE])" stream_ended "$work/s2.out"
check "the stream on the lost node got an error event naming instance 1" \
  bash -c 'grep -h "^data: {\"error\"" "$@" | grep -q "instance 1 failed"' _ "$work/s1.out" "$work/s2.out"
check "/metrics: instance 1 down, 1 failure" \
  bash -c '[ "$1" = 0 ] && [ "$2" = 1 ]' _ "$(metric 'braid_instance_up{instance="1"}')" "$(metric braid_instance_failures_total)"
# The registry forgot node 3's blocks: the second document is computed on node 2, no move from
# the lost node is planned or fails, and it answers as node 3 did.
moves_from_lost() { grep -c '"event":"move_planned".*"from":1,' "$work/events.jsonl"; }
planned_before=$(moves_from_lost)
doc=$doc2 ask after2 "Which station logged the most trains?"
check "after the loss: the second document answered as before" [ "$(text "$work/after2.json")" = "$(text "$work/warm2.json")" ]
check "after the loss: nothing moved from the lost node (cached_tokens_remote 0)" [ "$(remote "$work/after2.json")" = 0 ]
check "after the loss: no move toward the lost node was tried (failures ${failures_before:-?} -> $(metric braid_kv_move_failures_total))" \
  [ "$(metric braid_kv_move_failures_total)" = "${failures_before:-x}" ]
check "after the loss: no move from the lost node was planned" [ "$(moves_from_lost)" = "$planned_before" ]

stop_cluster "3 nodes"
check "the launcher removed the nodes it made" [ "$("$nodes_sh" count)" = 0 ]
check "no veth or bridge of the nodes is left" [ -z "$(ip -o link show | grep -E ' bmt-(v[0-9]+|br)[@:]')" ]

echo "$failures failure(s)"
[ "$failures" = 0 ]
