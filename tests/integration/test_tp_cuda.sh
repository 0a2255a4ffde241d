#!/usr/bin/env bash
# Tensor parallelism on the CUDA backend (issue 34): 1 + 1x2 ranks with --device cuda give the same
# greedy outputs as 1 + 1x1, on the real model and on synthetic:smollm2-135m (whose three KV heads
# split 2 + 1). Both ranks of the pair share the machine's GPU 0, so the forward's all-reduces take
# the host-staged MPI path (transport/tp_collective_staged.h); the server log must say so. Skips
# (exit 77) where no CUDA GPU is usable (CI, or a build without CUDA).
#   tests/integration/test_tp_cuda.sh BRAID_BINARY MODEL
set -uo pipefail
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

greedy_texts() {  # the greedy completions of three prompts, one JSON string a line
  for p in "The capital of France is" "def fibonacci(n):" "Once upon a time, in a small village,"; do
    curl -s -m 60 "$url/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\": \"$p\", \"max_tokens\": 16, \"temperature\": 0, \"ignore_eos\": true}" |
      python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["text"]))'
  done
}

gguf=$model
for m in "$gguf" "synthetic:smollm2-135m:$gguf"; do
  model=$m # start_cluster serves $model
  tag=$(basename "${m%%:*}")
  start_cluster "$tag-tp1" --device cuda --instances 1 --tp 1 --kv-blocks 256 || exit 1
  greedy_texts > "$work/tp1.txt"
  stop_cluster
  start_cluster "$tag-tp2" --device cuda --instances 1 --tp 2 --kv-blocks 256 || exit 1
  greedy_texts > "$work/tp2.txt"
  stop_cluster
  check "$m: three greedy completions, tp=2 equals tp=1" cmp -s "$work/tp1.txt" "$work/tp2.txt"
  check "$m: tp=2 outputs are text" [ "$(grep -c '^"' "$work/tp2.txt")" = 3 ]
  grep -qs "host-staged MPI all-reduce" "$work/$tag-tp2.err" "$work/$tag-tp2.out" && ok "the ranks sharing GPU 0 reduce host-staged" ||
    fail "no 'host-staged MPI all-reduce' line in the server logs"
done
exit $((failures > 0))
