#!/usr/bin/env bash
# KV block moves from a lender in the middle of a long engine step (issue 33): the lender answers
# an ask for a prefix between two layers of its step, not only when the step ends, so a step longer
# than --move-timeout no longer makes the borrower time out and recompute.
#  - two one-rank instances, round-robin; BRAID_TEST_LAYER_DELAY makes every step of 400 tokens or
#    more sleep 0.5 s between its layers (30 layers: >= 15 s a step, on any machine; the sleep is a
#    lower bound, so a slower machine only lengthens it) while the short documents' steps run as usual;
#  - instance 0 caches a short document; a long prompt then starts its one long step there; once
#    /metrics shows instance 0 running it, the short document's question goes to instance 1, which
#    asks instance 0 for the prefix with --move-timeout 8: the move must land (cached_tokens_remote
#    > 0, no move failure counted) and the moved answer equal the computed one. Before the fix the
#    ask waited for the step's end (>= 13 s away) and timed out into a recompute.
#  - BUSY_LENDER_RELAY=1 runs the same with --restart-instances 1, where every move message goes
#    through the coordinator (MSG_KV_RELAY): the lender reads relayed asks mid-step the same way.
#  - --move-timeout 8 against an answer due within one layer (0.5 s sleep + one layer of a 450-token
#    prefill) leaves a wide margin under load; the only waits are bounded polls.
# Usage: test_kv_moves_busy_lender.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

short_doc=$(python3 -c 'print(" ".join(f"Clause {i}: part {i * 7} goes to depot {i % 5}." for i in range(14)))')
long_doc=$(python3 -c 'print(" ".join(f"Row {i}: the bakery on street {i * 5} sold {i % 6 + 3} loaves and {i % 8} cakes." for i in range(22)))')
body() {  # body DOCUMENT QUESTION MAX_TOKENS: a chat request over a document
  python3 -c 'import json,sys; print(json.dumps({"temperature": 0, "max_tokens": int(sys.argv[3]), "messages": [
      {"role": "system", "content": "You answer questions about the text below."}, {"role": "user", "content": sys.argv[1]},
      {"role": "user", "content": sys.argv[2]}]}))' "$1" "$2" "$3"
}
ask() {  # ask NAME QUESTION DOCUMENT [MAX_TOKENS]: the answer JSON in $work/NAME.json
  curl -s -m 300 "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$(body "$3" "$2" "${4:-8}")" > "$work/$1.json"
}
field() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"d": d}))' "$@" 2> /dev/null; }
text() { field "$1" 'd["choices"][0]["message"]["content"]'; }
remote() { field "$1" 'd["usage"]["prompt_tokens_details"]["cached_tokens_remote"]'; }
prompt_tokens() { field "$1" 'd["usage"]["prompt_tokens"]'; }
total() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
running_on_0() { [ "$(total 'braid_instance_running_sequences{instance="0"}')" -ge 1 ] 2> /dev/null; }

relay=()
[ "${BUSY_LENDER_RELAY:-0}" = 1 ] && relay=(--restart-instances 1 --rewarm-heads 0)
BRAID_TEST_LAYER_DELAY=0.5:400 start_cluster busy --instances 2 --router round-robin --kv-blocks 256 --threads 1 --move-timeout 8 \
  --events "$work/busy-events.jsonl" "${relay[@]}" || exit 1
ask first "Which depot does part 21 go to?" "$short_doc"     # instance 0 computes the short document
ask filler "Say hi." "Hello." 2                                # instance 1
n=$(prompt_tokens "$work/first.json")
check "the short document's prompt stays under the slowed size ($n < 400 tokens)" [ "${n:-999}" -lt 400 ]
ask long "Which street sold the most cakes?" "$long_doc" 1 &   # instance 0: one step of >= 15 s
long_pid=$!
check "instance 0 runs the long prompt's step" wait_for 120 running_on_0
ask moved "Which depot does part 21 go to?" "$short_doc"     # instance 1: moves the prefix from the busy instance 0
wait "$long_pid"
n=$(prompt_tokens "$work/long.json")
check "the long prompt is a slowed step ($n >= 400 tokens, <= 512: one step)" [ "${n:-0}" -ge 400 ] && [ "${n:-999}" -le 512 ]
check "the long prompt was answered" [ -n "$(text "$work/long.json")" ]
r=$(remote "$work/moved.json")
check "the busy lender answered in time: the prefix was moved (cached_tokens_remote ${r:-none} > 0)" [ "${r:-0}" -gt 0 ]
check "no move failed (braid_kv_move_failures_total $(total braid_kv_move_failures_total))" [ "$(total braid_kv_move_failures_total)" = 0 ]
check "the moved answer equals the computed one" [ -n "$(text "$work/first.json")" ] && [ "$(text "$work/first.json")" = "$(text "$work/moved.json")" ]
check "the events log has the planned move from instance 0 to 1" grep -q '"event":"move_planned".*"from":0,"to":1' "$work/busy-events.jsonl"
check "instance 0 logged the test delay (the knob reached the ranks)" grep -q "BRAID_TEST_LAYER_DELAY" "$work/busy.err"
stop_cluster busy

echo "$failures failure(s)"
[ "$failures" = 0 ]
