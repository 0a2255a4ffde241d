#!/usr/bin/env bash
# Start-up warm starts are bounded like re-warms (issue 37). A manifest made offline (braid batch
# --trace-out --trace-tokens, then braid manifest export --trace) holds 8 prompt heads of tenant
# acme and 2 of tenant ghost; 3000 stale lines and a malformed one are appended. A cluster with an
# API key for acme only and --warm-start-heads 3 must:
#  - become ready (the bound reached, the rest left out and counted: "... 3 heads warmed ... 5 left
#    out", braid_warm_start_heads_total{outcome="left_out"} 5);
#  - summarise the skipped lines in one log line by reason (3000 stale, 1 invalid, ghost's lines
#    "of an unknown tenant"), with no line per skipped line;
#  - count them in /metrics (braid_warm_start_lines_skipped_total by reason);
#  - have warmed acme's hottest heads: a probe resending one gets cached tokens.
# Usage: test_warm_start_bounds.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

key=sk-acme-warmbounds-2c9e7a1f5b3d
printf '%s tenant=acme\n' "$key" > "$work/keys"

python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
topics = ["bread", "soup", "pasta", "salad", "curry", "stew", "pie", "rice"]
with open(f"{work}/batch.jsonl", "w") as f:
    for i, t in enumerate(topics):
        p = (f"Recipe card {i}: how to cook {t} for four people. List the ingredients with quantities, "
             f"then the steps, each with its time and temperature, and end with one serving tip for {t}.")
        f.write(json.dumps({"id": f"a{i}", "tenant": "acme", "prompt": p, "max_tokens": 1, "temperature": 0}) + "\n")
        json.dump({"prompt": p, "max_tokens": 1, "temperature": 0}, open(f"{work}/probe{i}.json", "w"))
    for i in range(2):
        p = f"Ghost tenant note {i}: the vault combination is written on the back of the blue folder number {i}."
        f.write(json.dumps({"id": f"g{i}", "tenant": "ghost", "prompt": p, "max_tokens": 1, "temperature": 0}) + "\n")
PY
"$braid" batch --model "$model" --input "$work/batch.jsonl" --output /dev/null --trace-out "$work/t.trace" --trace-tokens \
  --threads 2 2> "$work/batch.err" > /dev/null || { fail "braid batch exited $?"; cat "$work/batch.err"; }
"$braid" manifest export --trace "$work/t.trace" --model "$model" --out "$work/m.jsonl" 2> "$work/export.err" \
  || { fail "manifest export exited $?"; cat "$work/export.err"; }
cp "$work/m.jsonl" "$work/warm.jsonl"
# 3000 stale lines: the first line with a token changed, so its content_hash no longer matches
python3 - "$work/m.jsonl" "$work/warm.jsonl" <<'PY'
import json, sys
first = json.loads(open(sys.argv[1]).readline())
with open(sys.argv[2], "a") as out:
    for i in range(3000):
        r = dict(first, chunk_tokens=[first["chunk_tokens"][0] + 1 + i % 7] + first["chunk_tokens"][1:], position=0, prev_hash="")
        out.write(json.dumps(r) + "\n")
    out.write('{"content_hash": "00000000000000ff", "chunk_tokens": [1, 2,\n')
PY

start_cluster warm --instances 1 --kv-blocks 512 --api-keys "$work/keys" --warm-start "$work/warm.jsonl" \
  --warm-start-heads 3 || exit 1
metric_k() { curl -s "$url/metrics" -H "Authorization: Bearer $key" | awk -v n="$1" '$1 == n {print $2}'; }

check "warm start done: 3 heads warmed, 5 left out" grep -qE "warm start done .*: 3 heads warmed .* 0 refused, 5 left out" "$work/warm.err"
check "one summary line for the skipped lines" [ "$(grep -c 'lines skipped' "$work/warm.err")" = 1 ]
check "... naming 3000 stale lines" grep -qE "lines skipped: .*3000 stale \(first: line [0-9]+, stale" "$work/warm.err"
check "... the malformed line" grep -qE "lines skipped: .*1 invalid \(first: line [0-9]+" "$work/warm.err"
check "... and the unknown tenant's lines" grep -qE "lines skipped: .*[1-9][0-9]* of an unknown tenant \(first: line [0-9]+, tenant 'ghost'" "$work/warm.err"
check "no log line per skipped line ($(wc -l < "$work/warm.err") lines in all)" [ "$(wc -l < "$work/warm.err")" -lt 200 ]
check "/metrics: 3 heads warmed" [ "$(metric_k 'braid_warm_start_heads_total{outcome="warmed"}')" = 3 ]
check "/metrics: 5 heads left out" [ "$(metric_k 'braid_warm_start_heads_total{outcome="left_out"}')" = 5 ]
check "/metrics: 3000 stale lines" [ "$(metric_k 'braid_warm_start_lines_skipped_total{reason="stale"}')" = 3000 ]
check "/metrics: the unknown tenant's lines" [ "$(metric_k 'braid_warm_start_lines_skipped_total{reason="unknown_tenant"}')" -ge 2 ]
hits=0
for i in 0 1 2 3 4 5 6 7; do
  c=$(curl -s "$url/v1/completions" -H 'Content-Type: application/json' -H "Authorization: Bearer $key" -d @"$work/probe$i.json" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"])')
  [ "${c:-0}" -gt 0 ] && hits=$((hits + 1))
done
check "warmed heads hit the cache (probes with cached tokens: $hits, at least 3)" [ "$hits" -ge 3 ]
stop_cluster warm

echo "warm start bounds: $failures failure(s)"
[ "$failures" = 0 ]
