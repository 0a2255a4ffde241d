#!/usr/bin/env bash
# synthetic:NAME through the CLI on the CPU (issue 34): `braid generate` and `braid batch` run the
# synthetic SmolLM2 shape with the model file's tokenizer, to a fixed length (--ignore-eos /
# ignore_eos), the same tokens twice; an unknown name and a missing tokenizer are clear errors.
#   tests/integration/test_synthetic_cli.sh BRAID_BINARY MODEL_PATH
set -u
braid=$1
model=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failed=0
check() { local name=$1; shift; if "$@"; then echo "ok   $name"; else failed=$((failed + 1)); echo "FAIL $name"; fi; }
contains() { grep -qF -- "$2" "$1"; }

spec="synthetic:smollm2-135m:$model"
for run in 1 2; do
  "$braid" generate --model "$spec" --prompt "Hello" --max-tokens 3 --ignore-eos --threads 2 > "$tmp/gen$run.out" 2> "$tmp/gen$run.err"
  echo "rc=$?" >> "$tmp/gen$run.err"
done
check "generate exits 0" contains "$tmp/gen1.err" "rc=0"
check "generate names the synthetic shape" contains "$tmp/gen1.err" "synthetic SmolLM2-135M shape"
check "generate runs to the fixed length (3 tokens, finish: length)" contains "$tmp/gen1.err" "completion 3 tokens"
check "generate gives the same text twice (deterministic weights)" cmp -s "$tmp/gen1.out" "$tmp/gen2.out"

printf '{"id":"a","prompt":"Once upon a time","max_tokens":3,"ignore_eos":true}\n' > "$tmp/in.jsonl"
"$braid" batch --model "$spec" --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" > "$tmp/batch.log" 2>&1
check "batch exits 0 ($(tail -1 "$tmp/batch.log"))" [ $? = 0 ]
check "batch answers with 3 tokens (finish_reason length)" python3 -c '
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r["completion_tokens"] == 3 and r["finish_reason"] == "length", r' "$tmp/out.jsonl"

"$braid" generate --model synthetic:gpt-17 --prompt "x" --max-tokens 1 > /dev/null 2> "$tmp/unknown.err"
rc=$?
check "an unknown synthetic name fails (rc $rc)" [ "$rc" != 0 ]
check "and lists the known names" contains "$tmp/unknown.err" "llama3-8b, llama3-1b, smollm2-135m"
"$braid" generate --model synthetic:smollm2-135m:/nonexistent.gguf --prompt "x" --max-tokens 1 > /dev/null 2> "$tmp/missing.err"
check "a missing tokenizer file is named" contains "$tmp/missing.err" "/nonexistent.gguf"
exit $((failed > 0))
