#!/usr/bin/env bash
# Slurm across nodes (issue 33): two "nodes" (network namespaces with their own hostname, /dev/shm
# and veth; tests/multinode/nodes.sh), one slurmd in each and slurmctld on node 1
# (tests/multinode/slurm-nodes.sh, a configuration of its own, never /etc/slurm), then
# `sbatch -N 2 launch/braid.sbatch` as a user would submit it. Checked:
#  - the job prints its API URL at node 1's address (the node names are not in DNS: braid-slurm
#    falls back to Slurm's NodeAddr) and answers through it from the root namespace;
#  - the coordinator + instance 0 run on node 1 and instance 1 on node 2 (each rank logs its host);
#  - with --router round-robin the second request over a document goes to node 2's instance, which
#    moves the prefix in over UCX (cached_tokens_remote > 0, the same greedy answer), and at least
#    the moved bytes crossed node 2's veth link;
#  - scancel ends the job with no braid process left.
# Every exit path removes the job, the Slurm daemons it started and the nodes. Exits 77 (skipped)
# only without root, network namespaces, unshare / nsenter, or the Slurm and munge daemons.
# Usage: test_slurm_nodes.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
nodes_sh=$root/tests/multinode/nodes.sh
slurm_sh=$root/tests/multinode/slurm-nodes.sh
export BRAID_NODES_PREFIX=bsl BRAID_NODES_NET=10.231.78

skip() { echo "skipped: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network and mount namespaces, Slurm daemons)"
for tool in ip unshare nsenter mpirun slurmctld slurmd munged sbatch squeue scancel; do
  command -v "$tool" > /dev/null || skip "$tool not found"
done
probe=bsl-probe-$$
ip netns add "$probe" 2> /dev/null || skip "ip netns add fails here (no network namespaces)"
ip netns del "$probe"
[ "$("$nodes_sh" count)" = 0 ] || "$nodes_sh" down  # a set left by a killed run of this test

work=$(mktemp -d)
chmod 755 "$work"  # slurmd writes the job's output here
job="" failures=0
cleanup() {
  [ -n "$job" ] && scancel "$job" 2> /dev/null
  "$slurm_sh" stop "$work/slurm" > /dev/null 2>&1
  "$nodes_sh" down
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM  # the EXIT trap then cleans up
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }

"$nodes_sh" up 2 || { echo "FAIL nodes.sh up 2"; exit 1; }
if ! timeout 120 "$slurm_sh" start "$work/slurm" > "$work/slurm-start.log" 2>&1; then
  cat "$work/slurm-start.log"; tail -n 20 "$work"/slurm/log/* 2> /dev/null
  skip "the Slurm daemons did not come up on the nodes"
fi
export SLURM_CONF=$work/slurm/slurm.conf
export UCX_NET_DEVICES=eth0  # every node's link is its eth0 (the job's ranks inherit it)
node1=$("$nodes_sh" addr 1)
port=$(python3 "$root/tests/integration/free_port.py")

doc=$(python3 -c 'print(" ".join(f"Clause {i}: the supplier ships part {i * 7} to depot {i % 5} within {i % 9 + 2} days." for i in range(40)))')
body() {
  python3 -c 'import json,sys; print(json.dumps({"temperature": 0, "max_tokens": 12, "messages": [
      {"role": "system", "content": "You answer questions about the text below."}, {"role": "user", "content": sys.argv[1]},
      {"role": "user", "content": "Which depot gets part 70?"}]}))' "$doc"
}
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"d": d}))' "$@" 2> /dev/null; }
counter() { cat "/sys/class/net/$("$nodes_sh" veth 2)/statistics/$1"; }
metric() { curl -s "$base/metrics" | awk -v m="$1" '$1 == m { s += $2 } END { print s + 0 }'; }

job=$(cd "$root" && BRAID_BIN=$braid sbatch --parsable --overcommit -N 2 --ntasks-per-node=2 -o "$work/job-%j.out" \
  launch/braid.sbatch --model "$model" --instances 2 --router round-robin --kv-blocks 96 --host-kv-blocks 0 --port "$port")
echo "submitted job $job (port $port)"
url=""
for _ in $(seq 1 240); do
  url=$(grep -o 'API URL http://[^ ]*/v1' "$work/job-$job.out" 2> /dev/null | head -1 | cut -d' ' -f3)
  [ -n "$url" ] && break
  [ -n "$(squeue -h -j "$job" 2> /dev/null)" ] || break
  sleep 0.5
done
if [ -z "$url" ]; then
  fail "job $job never printed its API URL"
  cat "$work/job-$job.out" 2> /dev/null
  exit 1
fi
ok "job printed the API URL $url"
base=${url%/v1}
check "the URL is node 1's address (NodeAddr), the node names not being in DNS" [ "$url" = "http://$node1:$port/v1" ]
check "the job ran on both nodes" bash -c "[ \"\$(squeue -h -j $job -o %N)\" = 'bsl-n[1-2]' ]"
check "instance 0's rank runs on node 1" grep -q 'braid serve: rank 1 (worker 1 of 1 on bsl-n1)' "$work/job-$job.out"
check "instance 1's rank runs on node 2" grep -q 'braid serve: rank 2 (worker 1 of 1 on bsl-n2)' "$work/job-$job.out"

curl -s -m 180 "$url/chat/completions" -H 'Content-Type: application/json' -d "$(body)" > "$work/first.json"
check "first request over the document (instance 0, node 1): an answer" [ -n "$(field "$work/first.json" 'd["choices"][0]["message"]["content"]')" ]
tx_before=$(counter tx_bytes) rx_before=$(counter rx_bytes)
curl -s -m 180 "$url/chat/completions" -H 'Content-Type: application/json' -d "$(body)" > "$work/second.json"
tx_after=$(counter tx_bytes) rx_after=$(counter rx_bytes)
remote=$(field "$work/second.json" 'd["usage"]["prompt_tokens_details"]["cached_tokens_remote"]')
check "second request (round-robin to node 2) reads the prefix moved from node 1 (cached_tokens_remote $remote)" \
  bash -c "[ '${remote:-0}' -gt 0 ] 2> /dev/null"
check "the moved prefix gives the same greedy answer" \
  [ "$(field "$work/first.json" 'd["choices"][0]["message"]["content"]')" = "$(field "$work/second.json" 'd["choices"][0]["message"]["content"]')" ]
moved=$(metric braid_kv_moved_in_bytes_total)
into_node2=$((tx_after - tx_before))  # the bridge side's tx: bytes sent into node 2
check "the moved bytes ($moved) crossed node 2's link ($into_node2 bytes in)" bash -c "[ $moved -gt 0 ] && [ $into_node2 -ge $moved ]"
echo "node 2's link during the second request: $into_node2 bytes in, $((rx_after - rx_before)) out; KV moved in: $moved bytes"

scancel "$job"
gone() { [ -z "$(squeue -h -j "$job" 2> /dev/null)" ]; }
for _ in $(seq 1 120); do gone && break; sleep 0.5; done
check "scancel: the job leaves the queue" gone
sleep 2
check "scancel: no braid process left" bash -c "! pgrep -f '[b]raid serve .*--port $port( |\$)' > /dev/null"
job=""
echo "$failures failure(s)"
[ "$failures" = 0 ]
