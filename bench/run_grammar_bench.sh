#!/usr/bin/env bash
# Constrained vs unconstrained decode throughput through `braid batch`: C concurrent sequences
# (default 16), each a distinct chat prompt decoding exactly N tokens (default 64). The constrained
# run gives every request a grammar spec (a Pydantic-like person schema, 8 items separated by
# newlines, so no output completes before N tokens); the unconstrained run uses ignore_eos. Both
# greedy. Runs interleave (A B A B ...) ROUNDS times (default 3) so a slow spell on a shared
# machine hits both; reports median generated tok/s of each and their ratio.
#   [ROUNDS=n] [BRAID=build/braid] bench/run_grammar_bench.sh [MODEL] [C] [N] [extra braid batch flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
conc=${2:-16}
tokens=${3:-64}
shift 3 || shift $# || true
braid=${BRAID:-build/braid}
rounds=${ROUNDS:-3}
out=${OUT:-/tmp/braid-grammar-bench}
mkdir -p "$out"
echo "[bench] $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$out" "$conc" "$tokens" <<'PY'
import json, sys
out, conc, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
          "city": {"$ref": "#/$defs/City"}, "hobbies": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
          "email": {"type": "string", "format": "email"}}, "required": ["name", "age", "city"],
          "$defs": {"City": {"type": "object", "properties": {"name": {"type": "string"}, "country": {"type": "string"}},
                             "required": ["name", "country"]}}}
topics = ["a pilot", "a chef", "a chess player", "a gardener", "a violinist", "a nurse", "a sailor", "a baker",
          "a poet", "a carpenter", "a diver", "a judge", "a painter", "a farmer", "a coder", "a runner"]
with open(f"{out}/constrained.jsonl", "w") as c, open(f"{out}/free.jsonl", "w") as f:
    for i in range(conc):
        msgs = [{"role": "user", "content": f"Invent {topics[i % len(topics)]} number {i} and describe them as JSON objects, one per line."}]
        base = {"id": f"r{i}", "messages": msgs, "max_tokens": tokens}
        c.write(json.dumps(dict(base, grammar={"schema": schema, "min_items": 8, "max_items": 8, "separator": "\n"})) + "\n")
        f.write(json.dumps(dict(base, ignore_eos=True)) + "\n")
PY
printf 'round\tmode\tgenerated_tok_s\tgenerated\n' > "$out/runs.tsv"
for round in $(seq 1 "$rounds"); do
  for mode in free constrained; do
    "$braid" batch --model "$model" --input "$out/$mode.jsonl" --output "$out/res_$mode.jsonl" --max-running "$conc" \
      --kv-blocks 1024 --cache off "$@" 2> "$out/log_$mode.txt" > /dev/null
    tps=$(grep -oE '[0-9.]+ generated tok/s' "$out/log_$mode.txt" | cut -d' ' -f1)
    gen=$(python3 -c "import json,sys; print(sum(json.loads(l)['completion_tokens'] for l in open(sys.argv[1])))" "$out/res_$mode.jsonl")
    printf '%s\t%s\t%s\t%s\n' "$round" "$mode" "$tps" "$gen" >> "$out/runs.tsv"
    echo "[bench] round $round/$rounds, $mode: $tps generated tok/s ($gen tokens)" >&2
  done
done
python3 - "$out/runs.tsv" <<'PY'
import csv, statistics, sys
runs = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
med = {m: statistics.median(float(r["generated_tok_s"]) for r in runs if r["mode"] == m) for m in ("free", "constrained")}
print(f"unconstrained median {med['free']:.1f} tok/s, constrained median {med['constrained']:.1f} tok/s, "
      f"ratio {med['constrained'] / med['free']:.3f}")
PY
