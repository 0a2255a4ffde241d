#!/usr/bin/env bash
# forkkv_live.sh — ForkKV live on the CPU cluster (issues 16, 36): --lora-cache separate vs shared
# vs auto at equal KV memory, on react-lora and mapreduce-lora, one adapter per agent, every
# workflow concurrent (high contention), arms back to back in one run. auto gets separate's KV
# blocks as its unified pool (residuals borrow base blocks; issue 36).
#   bench/forkkv_live.sh OUT
# Environment (defaults in brackets): WORKLOADS [react-lora mapreduce-lora], WORKFLOWS [8],
# CONCURRENCY [8], CONTEXT_TOKENS [1024], FANOUT [4], SCALE [0.5], MAX_TOKENS_CAP [64],
# SEP_BLOCKS [320] (separate mode's KV pool, blocks of 16 tokens), RES_EQUIV [64] (of those, the
# base-block equivalents shared mode gives its residual pool: RES_EQUIV * ratio residual blocks,
# ratio = base block bytes / residual block bytes, kv_dim / rank = 12 for SmolLM2-135M at rank 16),
# ARMS [separate shared] (any of separate shared auto), BRAID_BIN / BENCH_BIN (frozen binaries),
# DEVICE [cpu] (cuda: the GPU backend), ADAPTERS [files] (synthetic: random rank-LORA_RANK [16]
# adapters of the model's shape, `--lora NAME=synthetic:RANK:SEED`, for synthetic models such as
# synthetic:llama3-8b that have no adapter files; set RATIO to the model's kv_dim / rank, 64 for the
# 8B shape at rank 16), RUN_ARGS [] (more braid-bench run flags, e.g. --fixed-output).
# Writes OUT/<workload>-<arm>/ (braid-bench run results), OUT/<arm>.err (server logs, which name
# the pools' bytes) and OUT/table.md. Prints progress on stderr. The mean decode batch (the paper's
# Fig. 14c) is sampled from /metrics (braid_instance_running_sequences, every 2 s while the bench
# runs; the mean over samples with any sequence running) into OUT/<workload>-<arm>.batch.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:?usage: bench/forkkv_live.sh OUT}
mkdir -p "$out"
WORKLOADS=${WORKLOADS:-react-lora mapreduce-lora}
WORKFLOWS=${WORKFLOWS:-8}
CONCURRENCY=${CONCURRENCY:-8}
CONTEXT_TOKENS=${CONTEXT_TOKENS:-1024}
FANOUT=${FANOUT:-4}
SCALE=${SCALE:-0.5}
MAX_TOKENS_CAP=${MAX_TOKENS_CAP:-64}
SEP_BLOCKS=${SEP_BLOCKS:-320}
RES_EQUIV=${RES_EQUIV:-64}
ARMS=${ARMS:-separate shared}
RATIO=${RATIO:-12} # 2 * 30 layers * 192 kv dims * 16 slots * 2 B over 2 * 30 * 16 ranks * 16 * 2 B (the server log says the same)
DEVICE=${DEVICE:-cpu}
ADAPTERS=${ADAPTERS:-files}
LORA_RANK=${LORA_RANK:-16}
RUN_ARGS=${RUN_ARGS:-}
# shellcheck source=serve_lib.sh
source "$root/bench/serve_lib.sh"

adapter() {  # the path of committed adapter $1 (index $2 seeds a synthetic one)
  if [ "$ADAPTERS" = synthetic ]; then echo "synthetic:$LORA_RANK:$2"; else echo "$root/adapters/$1.gguf"; fi
}

adapters_for() {  # the --lora flags for a workload's adapter names, from the four committed adapters
  local files=(planner coder tester summarizer)
  if [ "$1" = react-lora ]; then
    echo "--lora lora-planner=$(adapter planner 1) --lora lora-actor=$(adapter coder 2)" \
         "--lora lora-answerer=$(adapter summarizer 3)"
  else
    local flags="--lora lora-reducer=$(adapter summarizer 3)"
    for k in $(seq 0 $((FANOUT - 1))); do flags+=" --lora lora-mapper-$k=$(adapter "${files[$((k % 4))]}" $((10 + k)))"; done
    echo "$flags"
  fi
}

table=$out/table.md
echo "| workload | arm | KV pool (base blocks + residual blocks) | req/s | generated tok/s | mean workflow latency | mean TTFT | hit rate | fork tokens | preemptions | mean running | wall |" > "$table"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" >> "$table"

sample_running() {  # every 2 s, the instance's running sequences, into $1 (until killed)
  while sleep 2; do metric 'braid_instance_running_sequences{instance="0"}' >> "$1" || true; done
}
for w in $WORKLOADS; do
  for arm in $ARMS; do
    # shellcheck disable=SC2046
    if [ "$arm" = auto ]; then
      # auto's unified pool (cache/residual_cache.h): every base block is the base cache's until a
      # residual borrows it; --residual-blocks only numbers the residual arrays (RES_EQUIV x RATIO).
      res=$((RES_EQUIV * RATIO))
      pools="--kv-blocks $SEP_BLOCKS --lora-cache auto --residual-blocks $res"; pool_text="$SEP_BLOCKS unified (residuals borrow base blocks; $res residual ids)"
    elif [ "$arm" = shared ]; then
      base=$((SEP_BLOCKS - RES_EQUIV)); res=$((RES_EQUIV * RATIO))
      pools="--kv-blocks $base --lora-cache $arm --residual-blocks $res"; pool_text="$base + $res (= $SEP_BLOCKS base-block bytes)"
    else
      pools="--kv-blocks $SEP_BLOCKS --lora-cache separate"; pool_text="$SEP_BLOCKS + 0"
    fi
    echo "[forkkv_live] $w / $arm: $pool_text; $(date -u +%H:%M:%S), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    # shellcheck disable=SC2086
    serve "$w-$arm" --device "$DEVICE" --host-kv-blocks 0 $pools $(adapters_for "$w")
    dir=$out/$w-$arm
    : > "$dir.batch"
    sample_running "$dir.batch" &
    sampler=$!
    "$bench" run --workload "$w" --url "$url" --model "$model" --workflows "$WORKFLOWS" --concurrency "$CONCURRENCY" \
      --context-tokens "$CONTEXT_TOKENS" --fanout "$FANOUT" --scale "$SCALE" --max-tokens-cap "$MAX_TOKENS_CAP" --seed 1 $RUN_ARGS \
      --out "$dir" 2> "$dir.progress" || echo "[forkkv_live] braid-bench failed (see $dir.progress)" >&2
    kill "$sampler" 2> /dev/null || true
    wait "$sampler" 2> /dev/null || true
    running=$(awk '$1 > 0 {s += $1; n++} END {if (n) printf "%.2f", s / n; else print "-"}' "$dir.batch")
    forks=$(metric braid_kv_fork_tokens_total); preempt=$(metric 'braid_instance_preemptions_total{instance="0"}')
    # auto: the server log says when each adapter's choice changed and what the cost model compared.
    [ "$arm" = auto ] && grep -- '--lora-cache auto' "$out/$w-$arm.err" > "$out/$w-$arm.choices" || true
    stop
    python3 - "$dir/summary.json" "$w" "$arm" "$pool_text" "${forks:-0}" "${preempt:-0}" "$running" >> "$table" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
w, arm, pools, forks, preempt, running = sys.argv[2:]
print(f"| {w} | {arm} | {pools} | {s['req_s']:.3f} | {s['generated_tok_s']:.1f} | {s['mean_workflow_latency_s']:.1f} s | "
      f"{s['mean_ttft_ms'] / 1000:.1f} s | {100 * s['hit_rate']:.1f}% | {forks} | {preempt} | {running} | {s['wall_s']:.0f} s |"
      + ("" if s['errors'] == 0 else f" ({s['errors']} errors)"))
PY
    tail -1 "$table" >&2
  done
done
cat "$table"
