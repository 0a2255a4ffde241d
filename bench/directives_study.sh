#!/usr/bin/env bash
# Cache directives study (issue 18, Leyline): hit rate and quality with directives vs plain radix
# on the real model, through `braid batch` (calls in arrival order, at most MAX_RUNNING at once,
# greedy, MAX_TOKENS each, first-token logits kept).
#
# edit-replay (Leyline App. B: build 6 turns, edit an early turn's topic word, replay the whole
# edited conversation). Arms, each a fresh run over the same calls:
#   off       no prefix cache (every prompt computed);
#   radix     the prefix cache (exact segment reuse, the default): the replay hits up to the edit;
#   approx    automatic segment reuse, approximate, window 0 (content hashes + delta-RoPE, the
#             paper's own splice arm: no client involvement);
#   amortize  the replay call carries the *cached* conversation (the last build prompt) and a splice
#             directive naming the edited words; the engine computes the replacement and rotates
#             everything after it;
#   forget    the same directive with mode forget (trim from the edit, recompute).
# Reported: replay-phase and all-call hit rate ((cached + reused) / prompt tokens), and against the
# radix arm (which computes every replay from its edited text, i.e. the full-context answer): first-
# token argmax agreement, MAX_TOKENS-token agreement, KL(radix || arm) of the first token.
#
# cross-tenant sharing is measured live: bench/directives_tenants.sh.
# Usage: bench/directives_study.sh [OUT_DIR]   (env: WORKFLOWS=6 SCALE=0.5 MAX_TOKENS=16 MAX_RUNNING=4 THREADS=2
#        ARMS="off radix approx amortize forget")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/directives}
workflows=${WORKFLOWS:-6}
arms=${ARMS:-off radix approx amortize forget}
scale=${SCALE:-0.5}
max_tokens=${MAX_TOKENS:-16}
max_running=${MAX_RUNNING:-4}
threads=${THREADS:-2}
mkdir -p "$out"

run_arm() {  # run_arm WORKLOAD ARM INPUT ARGS...
  local wl=$1 arm=$2 input=$3; shift 3
  echo "[directives] $wl: $arm" >&2
  local t0=$SECONDS
  "$braid" batch --model "$model" --input "$input" --output "$out/$wl.$arm.jsonl" --logits-out "$out/$wl.$arm.logits" \
    --max-running "$max_running" --threads "$threads" "$@" 2> "$out/$wl.$arm.err" > /dev/null
  echo "$((SECONDS - t0))" > "$out/$wl.$arm.secs"
}

gen() {  # gen WORKLOAD N
  "$bench" gen --workload "$1" --workflows "$2" --concurrency 4 --scale "$scale" --model "$model" \
    --out "$out/$1.trace" --batch-out "$out/$1.batch.jsonl" 2> "$out/$1.gen.err"
}

# ---- edit-replay ----
gen edit-replay "$workflows"
python3 "$root/bench/directives_transform.py" edit-replay "$out/edit-replay.batch.jsonl" "$out/edit-replay" "$max_tokens"
for arm in $arms; do
  case $arm in
    off) run_arm edit-replay off "$out/edit-replay.in-plain.jsonl" --cache off ;;
    radix) run_arm edit-replay radix "$out/edit-replay.in-plain.jsonl" ;;
    approx) run_arm edit-replay approx "$out/edit-replay.in-plain.jsonl" --segment-reuse approx --approx-window 0 ;;
    amortize | forget) run_arm edit-replay "$arm" "$out/edit-replay.in-$arm.jsonl" ;;
    *) echo "unknown arm $arm" >&2; exit 2 ;;
  esac
done

python3 "$root/bench/directives_transform.py" report "$out" "$max_tokens" | tee "$out/table.md"
