#!/usr/bin/env bash
# Leyline edits whose savings last, and the server's own splices (issue 36): edit-replay (App. B:
# build 6 turns, edit an early turn's topic word, replay) with FOLLOWUPS=3 more turns of each
# replayed conversation, through `braid batch` one call at a time (greedy, MAX_TOKENS each,
# first-token logits kept). Arms, each a fresh run over the same calls:
#   radix              plain prompts (the replay computed past the edit: the full-context answer);
#   amortize-noscope   the client's splice on the replay; follow-ups without workflow_id (what a
#                      later turn got before conversation scopes: the spliced blocks are invisible);
#   amortize           the same, follow-ups in the same workflow: they hit the spliced blocks;
#   auto               every call sends its prompt as is with "auto_splice": "amortize": the server
#                      diffs against the workflow's recent prompts and plans the replay's splice.
# Reported per arm: hit rate ((cached + reused) / prompt tokens) of the replays, of each follow-up
# round and of all calls; first-token agreement of the follow-ups with radix.
# Usage: bench/directives_followup.sh [OUT_DIR]  (env: WORKFLOWS=6 SCALE=0.5 MAX_TOKENS=16 THREADS=2
#        KV_BLOCKS=512 ARMS="radix amortize-noscope amortize auto" SKIP_GEN=)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/directives_followup}
workflows=${WORKFLOWS:-6}
arms=${ARMS:-radix amortize-noscope amortize auto}
scale=${SCALE:-0.5}
max_tokens=${MAX_TOKENS:-16}
threads=${THREADS:-2}
kv_blocks=${KV_BLOCKS:-512}
mkdir -p "$out"

if [ -z "${SKIP_GEN:-}" ]; then  # SKIP_GEN=1: arms of another run of this script into the same OUT_DIR
  "$bench" gen --workload edit-replay --workflows "$workflows" --concurrency 4 --scale "$scale" --model "$model" \
    --out "$out/edit-replay.trace" --batch-out "$out/edit-replay.batch.jsonl" 2> "$out/gen.err"
  python3 "$root/bench/directives_transform.py" edit-followup "$out/edit-replay.batch.jsonl" "$out/edit-followup" "$max_tokens"
fi
for arm in $arms; do
  input=$arm
  [ "$arm" = radix ] && input=plain
  echo "[followup] $arm" >&2
  t0=$SECONDS
  "$braid" batch --model "$model" --input "$out/edit-followup.in-$input.jsonl" --output "$out/edit-followup.$arm.jsonl" \
    --logits-out "$out/edit-followup.$arm.logits" --max-running 1 --threads "$threads" --kv-blocks "$kv_blocks" \
    2> "$out/edit-followup.$arm.err" > /dev/null
  echo "$((SECONDS - t0))" > "$out/edit-followup.$arm.secs"
done
python3 "$root/bench/directives_transform.py" followup-report "$out" "$max_tokens" | tee "$out/followup.md"
