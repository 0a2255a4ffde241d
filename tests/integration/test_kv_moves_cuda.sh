#!/usr/bin/env bash
# KV block moves between two CUDA instances on one GPU (issue 34), through the real move path:
# the router sends the second request (round-robin) to the cold instance, which moves the prefix
# from instance 0 by CUDA IPC (worker/kv_move_cuda.h: the lender's pool opened once, runs copied
# device to device on the borrower's stream, landing polled by an event):
#  - usage.prompt_tokens_details.cached_tokens_remote > 256 on the moved request, /metrics counts
#    moved blocks and bytes, no failure, the events log has the planned move, both servers' logs
#    say the moves go over CUDA IPC;
#  - the moved answer equals instance 0's own answer from its cache (the same prefix K/V bits and the
#    same suffix computation); against the first, computed one it is compared and a difference only
#    reported (a one-pass prefill tiles differently: a bf16 near-tie may flip a token);
#  - the other direction (instance 0 moves a second document's prefix from instance 1), then a
#    third document the same way (instance 0's mapping of instance 1's pool, opened once, reused):
#    the moved blocks grow each time, no move fails.
#  - the cross-node path on the same GPU: a second cluster with BRAID_KV_MOVE_STAGED=1 (the lender
#    stages every loan through a pinned window, the borrower reads it over UCX through its pinned
#    landing ring and copies it host to device, worker/kv_move_cuda_staged.h), the same checks, both
#    directions and a third document (windows and rings reused), the servers' logs name the staged
#    path, and the router learns the pair's rate with link cuda_staged.
# Prints one line {"bench":"kv_moves_cuda", ...} per path (IPC, then "kv_moves_cuda_staged") with the
# moved bytes and the server-side move time the coordinator learned (GB/s per pair, from the events
# log), for scripts/gpu-suite.sh. KV_MOVES_CUDA_ONLY=ipc or =staged runs one cluster alone.
# Skips (exit 77) where no CUDA GPU is usable (CI, or a build without CUDA).
#   tests/integration/test_kv_moves_cuda.sh BRAID_BINARY MODEL
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

if ! "$braid" generate --device cuda --model "$model" --prompt "hi" --max-tokens 1 > "$work/probe.log" 2>&1; then
  echo "no usable CUDA GPU / CUDA build: skipping ($(tail -1 "$work/probe.log"))"
  exit 77
fi

doc=$(python3 -c 'print(" ".join(f"Clause {i}: the supplier ships part {i * 7} to depot {i % 5} within {i % 9 + 2} days." for i in range(40)))')
doc2=$(python3 -c 'print(" ".join(f"Entry {i}: the station at km {i * 3} logged {i % 7 + 1} trains and {i % 4} delays." for i in range(40)))')
doc3=$(python3 -c 'print(" ".join(f"Row {i}: the warehouse in aisle {i * 5} holds {i % 6 + 3} pallets of item {i * 11}." for i in range(40)))')
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
total() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
# same_or_note WHAT A B: a moved answer against one computed in one prefill pass: bf16 prefill tilings differ
# between a whole prompt and a suffix over cached blocks, so a near-tie may flip a greedy token; reported, not failed
same_or_note() { if [ "$(text "$2")" = "$(text "$3")" ]; then ok "$1"; else echo "note $1: differs (bf16 near-tie?): $(text "$2") | $(text "$3")"; fi; }

# moves_case CLUSTER LINK BENCH: the three documents through one cluster, checks and the bench line
moves_case() {
  local cl=$1 link=$2 bench=$3
  : > "$work/events.jsonl"
  start_cluster "$cl" --device cuda --instances 2 --router round-robin --kv-blocks 256 --events "$work/events.jsonl" --move-timeout 5 || exit 1
  ask first "Which depot does part 14 go to?"   # instance 0 computes
  ask moved "Which depot does part 14 go to?"   # instance 1 moves the prefix in ($link)
  ask local "Which depot does part 14 go to?"   # instance 0 again, from its own cache
  check "the first answer is text" [ -n "$(text "$work/first.json")" ]
  r=$(remote "$work/moved.json")
  check "the cold instance got the prefix by a move (cached_tokens_remote ${r:-none} > 256)" [ "${r:-0}" -gt 256 ]
  check "the moved answer equals instance 0's answer from its own cache" [ "$(text "$work/moved.json")" = "$(text "$work/local.json")" ]
  same_or_note "the moved answer equals the computed one" "$work/moved.json" "$work/first.json"
  blocks1=$(total braid_kv_moved_in_blocks_total)
  check "/metrics counts moved blocks (${blocks1:-none})" [ "${blocks1:-0}" -gt 0 ]
  check "/metrics counts moved bytes" [ "$(total braid_kv_moved_in_bytes_total)" -gt 0 ]
  check "no move failed" [ "$(total braid_kv_move_failures_total)" = 0 ]
  check "the events log has the planned move" grep -q '"event":"move_planned".*"from":0,"to":1' "$work/events.jsonl"
  if [ "$link" = cuda_ipc ]; then
    check "the servers say moves go over CUDA IPC" grep -q "KV moves over CUDA IPC" "$work/$cl.err" "$work/$cl.out"
  else
    check "the servers say moves are staged through pinned host memory" grep -q "KV moves over pinned host staging" "$work/$cl.err" "$work/$cl.out"
  fi
  # round-robin goes on: instance 1 computes a second document, instance 0 moves it in (the other direction)
  ask second-first "Which station logged the most trains?" "$doc2"
  ask second-moved "Which station logged the most trains?" "$doc2"
  blocks2=$(total braid_kv_moved_in_blocks_total)
  check "the other direction (1 -> 0) moves blocks (${blocks1:-0} -> ${blocks2:-0})" [ "${blocks2:-0}" -gt "${blocks1:-0}" ]
  same_or_note "the other direction's answer equals the computed one" "$work/second-moved.json" "$work/second-first.json"
  # and again 1 -> 0 with a third document: instance 0's mapping of instance 1's pool is reused
  ask third-first "Which aisle holds item 33?" "$doc3"
  ask third-moved "Which aisle holds item 33?" "$doc3"
  blocks3=$(total braid_kv_moved_in_blocks_total)
  check "a later move from the same lender (its pool opened once) moves blocks (${blocks2:-0} -> ${blocks3:-0})" [ "${blocks3:-0}" -gt "${blocks2:-0}" ]
  same_or_note "its answer equals the computed one" "$work/third-moved.json" "$work/third-first.json"
  check "still no move failed" [ "$(total braid_kv_move_failures_total)" = 0 ]
  blocks2=$blocks3
  bytes=$(total braid_kv_moved_in_bytes_total)
  check "the coordinator learned the pair's rate over $link (move_measured event)" \
    grep -q '"event":"move_measured".*"from":0,"to":1.*"link":"'"$link"'"' "$work/events.jsonl"
  gbps=$(grep '"event":"move_measured"' "$work/events.jsonl" | grep -o '"pair_gbps":[0-9.]*' | tail -1 | cut -d: -f2)
  echo "{\"bench\":\"$bench\",\"moved_blocks\":${blocks2:-0},\"moved_bytes\":${bytes:-0},\"pair_gbps\":${gbps:-0}}"
  stop_cluster "$cl"
}

if [ "${KV_MOVES_CUDA_ONLY:-}" != staged ]; then
  moves_case cuda cuda_ipc kv_moves_cuda
fi
if [ "${KV_MOVES_CUDA_ONLY:-}" != ipc ]; then
  # Across nodes on one GPU: IPC off for loans (BRAID_KV_MOVE_STAGED=1), staged through pinned host memory over UCX.
  export BRAID_KV_MOVE_STAGED=1
  moves_case staged cuda_staged kv_moves_cuda_staged
  unset BRAID_KV_MOVE_STAGED
fi
echo "$failures failure(s)"
[ "$failures" = 0 ]
