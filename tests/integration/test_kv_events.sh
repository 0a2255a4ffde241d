#!/usr/bin/env bash
# Integration test of KV events in vLLM's wire format (braid serve --kv-events-endpoint):
#   tests/integration/test_kv_events.sh BRAID_BINARY MODEL
# A real cluster (1 + 2x1 ranks under braid-local) publishes on a ZeroMQ PUB socket with a replay
# socket; a subscriber written against vLLM's schema (kv_events_subscriber.py: pyzmq + msgpack)
# listens while requests are served and "loses" two batches. Checks: sequence numbers run from 0
# without gaps; every published event equals the --events JSONL log's line for it (type, instance
# as data_parallel_rank, medium, block hashes, parent hash); BlockStored on insert carries
# block_size x blocks token ids; /metrics counts the registry's blocks as the log implies; the replay socket returns the lost batches byte for byte, and a
# late subscriber replaying from 0 gets every batch.
# Also: the flags' misuse is refused, and an unbindable endpoint stops start-up with its name.
# The python with pyzmq and msgpack: $BRAID_TEST_PYTHON, else .venv-test/bin/python, set up here
# (as scripts/test.sh does) when it lacks them.
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${BRAID_TEST_PYTHON:-$root/.venv-test/bin/python}
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

if ! "$python" -c 'import zmq, msgpack' 2> /dev/null; then
  echo "[kv-events] installing pyzmq and msgpack into .venv-test"
  { [ -x "$root/.venv-test/bin/python" ] || python3 -m venv "$root/.venv-test"; } &&
    "$root/.venv-test/bin/pip" install -q "pyzmq==26.2.0" "msgpack==1.1.0" || { echo "FAIL cannot install pyzmq/msgpack"; exit 1; }
  python=$root/.venv-test/bin/python
fi

# Misuse fails clearly: a replay socket or topic without the PUB endpoint is refused before start-up;
# an endpoint that cannot be bound stops the cluster with a message naming it.
"$braid" serve --model "$model" --kv-events-replay-endpoint tcp://127.0.0.1:1 > /dev/null 2> "$work/misuse.err"; status=$?
check "--kv-events-replay-endpoint alone refused (exit $status)" \
  grep -q -- "--kv-events-replay-endpoint needs --kv-events-endpoint" "$work/misuse.err"
port=$(free_port)
BRAID_BIN=$braid timeout 120 "$root/launch/braid-local" --model "$model" --port "$port" \
  --kv-events-endpoint tcp://no-such-host.invalid:5557 > /dev/null 2> "$work/bind.err"; status=$?
check "an unbindable endpoint stops start-up (exit $status)" [ "$status" != 0 ]
check "... naming the endpoint" grep -q "cannot bind PUB socket to tcp://no-such-host.invalid:5557" "$work/bind.err"
sleep 0.5
check "... and leaves no ranks" cluster_gone

pub_ep=tcp://127.0.0.1:$(free_port)
replay_ep=tcp://127.0.0.1:$(free_port)
topic=braid-kv
start_cluster kv-events --instances 2 --kv-blocks 24 --host-kv-blocks 8 --events "$work/events.jsonl" \
  --kv-events-endpoint "$pub_ep" --kv-events-replay-endpoint "$replay_ep" --kv-events-topic "$topic" || exit 1
check "start-up names the KV event endpoints" grep -q "publishing KV events on $pub_ep, replay on $replay_ep" "$work/kv-events.out"

"$python" "$root/tests/integration/kv_events_subscriber.py" listen "$pub_ep" "$work/seen.json" "$work/ready" "$work/stop" \
  "$topic" 1,2 "$replay_ep" &
sub_pid=$!
for _ in $(seq 1 100); do [ -e "$work/ready" ] && break; sleep 0.1; done
check "subscriber connected" [ -e "$work/ready" ]

# Concurrent requests (both instances get some), then the same prompts again (cached: no new
# inserts), then new ones; 24-block device pools and 8-block host tiers make blocks leave both tiers (BlockRemoved).
prompts=("The capital of France is a city that" "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) +"
         "Once upon a time in a land far away there lived" "The three primary colors are red, yellow and"
         "To make a cup of tea, first boil the water, then" "Water boils at one hundred degrees Celsius when")
for round in first first second; do
  curl_pids=()
  for p in "${prompts[@]}"; do
    curl -s -o /dev/null "$url/v1/completions" -H "Content-Type: application/json" \
      -d "{\"prompt\": \"The $round time: $p $p $p $p $p $p\", \"max_tokens\": 24, \"temperature\": 0}" &
    curl_pids+=($!)
  done
  wait "${curl_pids[@]}"
done
touch "$work/stop"
wait "$sub_pid"; sub_status=$?
check "subscriber finished (status $sub_status)" [ "$sub_status" = 0 ]
"$python" "$root/tests/integration/kv_events_subscriber.py" replay "$replay_ep" 0 "$work/late.json"
check "late subscriber's replay answered" [ -s "$work/late.json" ]
sleep 0.5 # the last KV events reach rank 0 after the last answer
curl -s "$url/metrics" > "$work/metrics.txt"
stop_cluster kv-events

python3 - "$work" <<'PY' || fail "published events match the schema, the --events log and the replay"
import json, sys
work = sys.argv[1]
got = json.load(open(f"{work}/seen.json"))
late = json.load(open(f"{work}/late.json"))
log = [json.loads(l) for l in open(f"{work}/events.jsonl")]
kv_lines = [e for e in log if e.get("event") == "kv"]

everything = sorted(got["seen"] + got["dropped"], key=lambda r: r["seq"])
seqs = [r["seq"] for r in everything]
assert seqs == list(range(len(seqs))), f"sequence numbers with gaps or not from 0: {seqs[:20]}..."
assert len(seqs) >= 3, f"only {len(seqs)} batches published"
print(f"ok   {len(seqs)} batches, sequence numbers 0..{len(seqs) - 1} without gaps")

# Every published event, in order, is the --events log's line for it.
medium = {"device": "GPU", "host": "CPU"}
published = [(r["batch"]["data_parallel_rank"], ev) for r in everything for ev in r["batch"]["events"]]
assert len(published) == len(kv_lines), f"{len(published)} events published, {len(kv_lines)} logged"
stored = removed = 0
for (rank, ev), line in zip(published, kv_lines):
    assert rank == line["instance"] and ev["type"] == line["type"], (rank, ev, line)
    if ev["type"] == "AllBlocksCleared":
        continue
    assert ev["medium"] == medium[line["medium"]], (ev, line)
    assert ["%016x" % h for h in ev["block_hashes"]] == line["block_hashes"], (ev, line)
    if ev["type"] == "BlockStored":
        parent = ev["parent_block_hash"]
        assert ("%016x" % parent if parent is not None else "0000000000000000") == line["parent_block_hash"], (ev, line)
        assert ev["block_size"] == 16 and ev["lora_id"] is None and ev["lora_name"] is None, ev
        if line["reason"] == "insert":
            assert len(ev["token_ids"]) == 16 * len(ev["block_hashes"]), ev
            assert all(isinstance(t, int) and 0 <= t < 49152 for t in ev["token_ids"]), ev
        stored += 1
    else:
        removed += 1
assert stored > 0 and removed > 0, f"{stored} BlockStored, {removed} BlockRemoved"
assert {rank for rank, _ in published} == {0, 1}, "events from both instances"
print(f"ok   {len(published)} events ({stored} BlockStored, {removed} BlockRemoved) equal the --events log")

# The registry holds what the log implies: inserted blocks, less those gone from every tier.
held = {}
for line in kv_lines:
    blocks = held.setdefault(line["instance"], set())
    if line["type"] == "AllBlocksCleared":
        blocks.clear()
    elif line["type"] == "BlockStored" and line["reason"] == "insert":
        blocks.update(line["block_hashes"])
    elif line["type"] == "BlockRemoved" and not line["on_device"] and not line["on_host"]:
        blocks.difference_update(line["block_hashes"])
metrics = dict(l.split() for l in open(f"{work}/metrics.txt") if l.startswith("braid_registry_"))
want = sum(len(b) for b in held.values())
assert int(metrics["braid_registry_blocks"]) == want > 0, (metrics, want)
assert int(metrics["braid_registry_evicted_blocks_total"]) == 0 and int(metrics["braid_registry_bytes"]) > 0, metrics
print(f"ok   /metrics: braid_registry_blocks {want}, as the log implies")

# The two lost batches come back from the replay socket, byte for byte, followed by the rest.
replayed = got["replayed"]
assert [r["seq"] for r in replayed] == seqs[1:], [r["seq"] for r in replayed]
by_seq = {r["seq"]: r["payload"] for r in everything}
assert all(r["payload"] == by_seq[r["seq"]] for r in replayed), "replayed bytes differ"
print(f"ok   lost batches 1 and 2 replayed byte for byte ({len(replayed)} batches from seq 1)")
assert [r["seq"] for r in late] == seqs and all(r["payload"] == by_seq[r["seq"]] for r in late)
print(f"ok   a late subscriber replays all {len(late)} batches from seq 0")
PY
[ "$failures" = 0 ] && echo "kv events: all checks passed" || echo "kv events: $failures check(s) failed"
exit $((failures > 0))
