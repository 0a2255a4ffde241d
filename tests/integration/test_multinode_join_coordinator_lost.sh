#!/usr/bin/env bash
# A joined instance whose coordinator dies notices and exits (issue 33 item 3), on two
# network-namespace nodes (tests/multinode/nodes.sh) in the one-MPI-job-per-node layout:
# ompi-server in the root namespace; node 1 the coordinator's job (`mpirun -n 2`, --join-slots 1);
# node 2 its own job (`mpirun -n 1 braid serve --join-instance 1 --coordinator-timeout 4`).
# The jobs are started here by hand (not by launch/braid-local --joinable, whose exit would stop
# the joiner for it and hide what is tested).
# Checked:
#  - the joiner is taken: /health "ready" with 2 of 2 instances up;
#  - every process of node 1 (the coordinator's mpirun and both its ranks) is killed -9: the joining
#    job on node 2 ends by itself within 4 s (--coordinator-timeout) + 16 s of slack, with a
#    nonzero exit status, and its output says why ("the coordinator is gone");
#  - a joiner that connects to a coordinator that never answers is bounded too: not tested (the
#    accept happens in the coordinator's own thread; see the notes).
# Every exit path (EXIT, INT, TERM) kills the processes this test started and removes the nodes.
# Needs root, ip netns, unshare, nsenter, mpirun and ompi-server: exits 77 (skipped) without them.
# Its own set of nodes (prefix bmc, 10.231.79.0/24), so it runs beside other multi-node tests.
# Usage: test_multinode_join_coordinator_lost.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
nodes_sh=$root/tests/multinode/nodes.sh
export BRAID_NODES_PREFIX=bmc BRAID_NODES_NET=10.231.79
net=$BRAID_NODES_NET
timeout_s=4

skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network and mount namespaces)"
for tool in ip unshare nsenter mpirun ompi-server curl python3; do command -v "$tool" > /dev/null || skip "$tool not found"; done
probe=bmc-probe-$$
ip netns add "$probe" 2> /dev/null || skip "ip netns add fails here (no network namespaces)"
ip netns del "$probe"
unshare --mount --uts true 2> /dev/null || skip "unshare --mount --uts fails here"
[ "$("$nodes_sh" count)" = 0 ] || "$nodes_sh" down  # a set left by a killed run of this test

work=$(mktemp -d)
pids=()  # every process this test started (ompi-server, the two mpirun jobs)
cleanup() {
  local p
  for p in "${pids[@]+"${pids[@]}"}"; do kill -KILL "$p" 2> /dev/null; done
  "$nodes_sh" down  # also kills what is left inside the nodes
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # the EXIT trap then cleans up
fail() {
  echo "FAIL: $*"
  for f in "$work"/*.log; do echo "--- $f"; grep -v '^\s*$' "$f" | tail -n 25; done
  exit 1
}
wait_for() {  # wait_for SECONDS CMD...: until CMD succeeds
  local t=$1
  shift
  for _ in $(seq 1 "$t"); do "$@" && return 0; sleep 1; done
  return 1
}

"$nodes_sh" up 2 || fail "nodes.sh up 2"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none UCX_NET_DEVICES=eth0
subnet=$net.0/24
ompi-server --no-daemonize -r "$work/ns.uri" -mca oob_tcp_if_include "$subnet" > "$work/ompi-server.log" 2>&1 &
pids+=($!)
wait_for 10 test -s "$work/ns.uri" || fail "ompi-server wrote no URI"
mpi=(--bind-to none -mca oob_tcp_if_include "$subnet" -mca btl_tcp_if_include "$subnet" -x UCX_NET_DEVICES --ompi-server "file:$work/ns.uri")
serve=(--model "$model" --threads 1 --kv-blocks 128 --instance-timeout 8)
url=http://$net.1:8000
"$nodes_sh" exec 1 mpirun --oversubscribe -n 2 "${mpi[@]}" "$braid" serve "${serve[@]}" --join-slots 1 --host "$net.1" --port 8000 \
  > "$work/coordinator.log" 2>&1 &
pids+=($!)
listening() { curl -s -m 2 -o /dev/null "$url/health"; }
wait_for 90 listening || fail "the coordinator never listened"
"$nodes_sh" exec 2 mpirun -n 1 "${mpi[@]}" "$braid" serve "${serve[@]}" --join-instance 1 --coordinator-timeout "$timeout_s" \
  > "$work/joiner.log" 2>&1 &
joiner=$!
pids+=($joiner)
ready() { [ "$(curl -s -m 5 "$url/health" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2> /dev/null)" = ready ]; }
ready_or_joiner_ended() { ready || ! kill -0 "$joiner" 2> /dev/null; }
wait_for 90 ready_or_joiner_ended && ready || fail "the joiner was not taken: $(curl -s -m 5 "$url/health")"
echo "ok: instance 1 joined from its own MPI job on node 2"
sleep $((timeout_s + 2))  # longer than the timeout: a live coordinator's alive messages keep the joiner up
kill -0 "$joiner" 2> /dev/null || fail "the joiner ended while its coordinator was alive"
echo "ok: the joiner stays up past --coordinator-timeout $timeout_s while its coordinator lives"

node1=$(ip netns pids bmc-n1)
# shellcheck disable=SC2086
[ -n "$node1" ] && kill -KILL $node1
t0=$(date +%s)
gone() { ! kill -0 "$joiner" 2> /dev/null; }
wait_for $((timeout_s + 16)) gone || fail "the joiner still runs $((timeout_s + 16)) s after its coordinator was killed"
took=$(($(date +%s) - t0))
wait "$joiner"; rc=$?
[ "$rc" != 0 ] || fail "the joiner exited 0 after losing its coordinator"
grep -q "the coordinator is gone" "$work/joiner.log" || fail "the joiner did not say why it stopped"
[ -z "$(ip netns pids bmc-n2)" ] || fail "processes left on node 2 after the joiner's job ended: $(ip netns pids bmc-n2)"
echo "ok: the joiner's job ended ${took} s after its coordinator was killed, exit status $rc: $(grep -o 'the coordinator is gone.*' "$work/joiner.log" | head -n 1)"
echo "PASS"
