#!/usr/bin/env bash
# The rejoinable layout under Slurm (issue 33 item 3): two "nodes" (network namespaces with their own
# hostname, /dev/shm and veth; tests/multinode/nodes.sh), one slurmd in each and slurmctld on node 1
# (tests/multinode/slurm-nodes.sh), then `sbatch -N 2 --ntasks-per-node=2 launch/braid.sbatch
# --joinable` as a user would submit it: ompi-server and the coordinator's job on node 1, and an
# `srun` step on node 2 whose own `mpirun -n 1` joins as instance 1 (launch/braid-slurm-joinable).
# Checked:
#  - the job prints its API URL (every instance joined) at node 1's address; /health "ready", 2 of 2;
#  - instance 1 runs on node 2 and joined from its own job (its log line), in a Slurm step there;
#  - with --router round-robin the second request over a document goes to the joined instance,
#    which moves the prefix in over UCX (cached_tokens_remote > 0, the same greedy answer);
#  - node 2's instance is lost (its braid and mpirun killed -9; slurmd stays): /health "degraded";
#    `launch/braid-slurm-joinable --rejoin-node bsj-n2 --jobid JOB` starts a new step that joins
#    again: "ready", instance 1 "restarts": 1, and a request is answered;
#  - scancel ends the job: it leaves the queue, no braid process is left, the state dir is removed.
# Every exit path removes the job, the Slurm daemons it started and the nodes. Exits 77 (skipped)
# only without root, network namespaces, unshare / nsenter, mpirun / ompi-server, or the Slurm and
# munge daemons.
# Usage: test_slurm_joinable.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
nodes_sh=$root/tests/multinode/nodes.sh
slurm_sh=$root/tests/multinode/slurm-nodes.sh
export BRAID_NODES_PREFIX=bsj BRAID_NODES_NET=10.231.80

skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network and mount namespaces, Slurm daemons)"
for tool in ip unshare nsenter mpirun ompi-server curl python3 slurmctld slurmd munged sbatch squeue scancel srun scontrol; do
  command -v "$tool" > /dev/null || skip "$tool not found"
done
probe=bsj-probe-$$
ip netns add "$probe" 2> /dev/null || skip "ip netns add fails here (no network namespaces)"
ip netns del "$probe"
[ "$("$nodes_sh" count)" = 0 ] || "$nodes_sh" down  # a set left by a killed run of this test

work=$(mktemp -d)
chmod 755 "$work"  # slurmd writes the job's output here
job="" rejoiner=""
cleanup() {
  [ -n "$rejoiner" ] && kill -KILL "$rejoiner" 2> /dev/null
  [ -n "$job" ] && scancel "$job" 2> /dev/null && sleep 2
  "$slurm_sh" stop "$work/slurm" > /dev/null 2>&1
  "$nodes_sh" down
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # the EXIT trap then cleans up
fail() {
  echo "FAIL: $*"
  for f in "$work"/job-*.out "$work"/*.log; do [ -f "$f" ] && { echo "--- $f"; grep -v '^\s*$' "$f" | tail -n 30; }; done
  exit 1
}
wait_for() {  # wait_for SECONDS CMD...: until CMD succeeds
  local t=$1
  shift
  for _ in $(seq 1 "$t"); do "$@" && return 0; sleep 1; done
  return 1
}

"$nodes_sh" up 2 || fail "nodes.sh up 2"
if ! timeout 120 "$slurm_sh" start "$work/slurm" > "$work/slurm-start.log" 2>&1; then
  cat "$work/slurm-start.log"; tail -n 20 "$work"/slurm/log/* 2> /dev/null
  skip "the Slurm daemons did not come up on the nodes"
fi
export SLURM_CONF=$work/slurm/slurm.conf
export UCX_NET_DEVICES=eth0                  # every node's link is its eth0 (the job's ranks inherit it)
export BRAID_JOIN_STATE=$work/join-state     # the layout's state (sbatch passes the environment on)
node1=$("$nodes_sh" addr 1)
port=$(python3 "$root/tests/integration/free_port.py")

doc=$(python3 -c 'print(" ".join(f"Clause {i}: the supplier ships part {i * 7} to depot {i % 5} within {i % 9 + 2} days." for i in range(40)))')
body() {
  python3 -c 'import json,sys; print(json.dumps({"temperature": 0, "max_tokens": 12, "messages": [
      {"role": "system", "content": "You answer questions about the text below."}, {"role": "user", "content": sys.argv[1]},
      {"role": "user", "content": "Which depot gets part 70?"}]}))' "$doc"
}
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"d": d}))' "$@" 2> /dev/null; }
health() { curl -s -m 5 "$base/health"; }
status() { health | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2> /dev/null; }

job=$(cd "$root" && BRAID_BIN=$braid sbatch --parsable --overcommit -N 2 --ntasks-per-node=2 -o "$work/job-%j.out" \
  launch/braid.sbatch --joinable --mpi-if eth0 --model "$model" --threads 1 --kv-blocks 128 --max-batch-tokens 128 \
  --router round-robin --instance-timeout 8 --coordinator-timeout 10 --port "$port")
echo "submitted job $job (port $port)"
out=$work/job-$job.out
url=""
for _ in $(seq 1 360); do
  url=$(grep -o 'API URL http://[^ ]*/v1' "$out" 2> /dev/null | head -1 | cut -d' ' -f3)
  [ -n "$url" ] && break
  [ -n "$(squeue -h -j "$job" 2> /dev/null)" ] || break
  sleep 0.5
done
[ -n "$url" ] || fail "job $job never printed its API URL"
base=${url%/v1}
[ "$url" = "http://$node1:$port/v1" ] || fail "the URL $url is not node 1's address"
[ "$(status)" = ready ] || fail "/health is not ready: $(health)"
echo "ok: job $job printed $url; /health: $(health | head -c 160)"
grep -q 'bsj-n2 joining as instance 1' "$out" || fail "no joining step ran on node 2"
grep -q 'joined the coordinator as instance 1' "$out" || fail "instance 1 did not say it joined"
echo "ok: instance 1 joined from its own job in a Slurm step on node 2"

curl -s -m 180 "$url/chat/completions" -H 'Content-Type: application/json' -d "$(body)" > "$work/first.json"
[ -n "$(field "$work/first.json" 'd["choices"][0]["message"]["content"]')" ] || fail "first request: $(cat "$work/first.json")"
curl -s -m 180 "$url/chat/completions" -H 'Content-Type: application/json' -d "$(body)" > "$work/second.json"
remote=$(field "$work/second.json" 'd["usage"]["prompt_tokens_details"]["cached_tokens_remote"]')
[ "${remote:-0}" -gt 0 ] 2> /dev/null || fail "the second request (round-robin to the joined instance) moved nothing in (cached_tokens_remote '${remote}')"
[ "$(field "$work/first.json" 'd["choices"][0]["message"]["content"]')" = "$(field "$work/second.json" 'd["choices"][0]["message"]["content"]')" ] ||
  fail "the moved prefix gave another greedy answer"
echo "ok: the joined instance moved the document's prefix in (cached_tokens_remote $remote), same answer"

# Node 2's instance lost: its braid and mpirun killed (slurmd stays, so the node can run a step again).
victims=""
for p in $(ip netns pids bsj-n2); do
  case "$(cat "/proc/$p/comm" 2> /dev/null)" in braid|mpirun) victims+=" $p" ;; esac
done
[ -n "$victims" ] || fail "no braid or mpirun process found on node 2"
# shellcheck disable=SC2086
kill -KILL $victims
degraded() { [ "$(status)" = degraded ]; }
wait_for 40 degraded || fail "the loss of node 2's instance was not seen: $(health)"
echo "ok: node 2's instance lost: $(health | head -c 200)"
"$root/launch/braid-slurm-joinable" --rejoin-node bsj-n2 --jobid "$job" > "$work/rejoin.log" 2>&1 &
rejoiner=$!
ready() { [ "$(status)" = ready ]; }
wait_for 120 ready || fail "instance 1 did not rejoin: $(health)"
echo "ok: node 2 rejoined through a new Slurm step: $(health | head -c 200)"
curl -s -m 180 "$url/chat/completions" -H 'Content-Type: application/json' \
  -d '{"max_tokens": 8, "messages": [{"role": "user", "content": "Say hello."}]}' > "$work/after.json"
[ -n "$(field "$work/after.json" 'd["choices"][0]["message"]["content"]')" ] || fail "request after the rejoin: $(cat "$work/after.json")"
echo "ok: a request after the rejoin was answered"

scancel "$job"
jobid=$job
gone() { [ -z "$(squeue -h -j "$job" 2> /dev/null)" ]; }
wait_for 60 gone || fail "scancel: the job did not leave the queue"
job=""
sleep 2
! pgrep -f "[b]raid serve .*--port $port( |\$)" > /dev/null || fail "scancel: a braid process is left: $(pgrep -af "[b]raid serve .*--port $port")"
wait_for 15 bash -c "! kill -0 $rejoiner 2> /dev/null" || fail "the --rejoin-node srun still runs after scancel"
rejoiner=""
[ ! -e "$BRAID_JOIN_STATE/$jobid" ] || fail "the job left its state in $BRAID_JOIN_STATE"
echo "ok: scancel ended the job, no braid process left, state removed"
echo "PASS"
