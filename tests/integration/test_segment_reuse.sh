#!/usr/bin/env bash
# Segment reuse (issue 17) end to end with the real model, through `braid batch` and `braid serve`:
#  - exact mode: prompts that share a message and then part mid-block reuse the message's tail
#    past the prefix cache's last whole block, and every greedy output equals the run without reuse;
#  - approx mode (window 0): prompts that carry the same long message after different system
#    prompts reuse most of it (segment_reused_tokens), counted apart from cached_tokens;
#  - bad input: an unknown segment_reuse value is a rejected line / HTTP 400;
#  - braid sim replays a trace with token ids with segment reuse (approx >> exact) and refuses one
#    without them;
#  - served: a request asking for approx on a server without --segment-reuse approx gets 400 naming
#    the field; with it, usage.prompt_tokens_details.segment_reused_tokens > 0 and /metrics counts
#    candidates, admissions by mode and prefill FLOPs saved.
# Usage: test_segment_reuse.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

# Two suites of chat requests: "tail" shares system + tool schema and asks different questions;
# "shifted" puts the same schema after system prompts of different lengths.
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
schema = "Tools you may call:\n" + "\n".join(
    f"- {name}(item: string, limit: int): returns the {what} of the item, checked against the {check} record"
    for name, what, check in [("price_of", "price", "stock"), ("weight_of", "weight", "shipping"), ("owner_of", "owner", "registry"),
                              ("origin_of", "origin", "customs"), ("rating_of", "rating", "review"), ("color_of", "color", "catalog")])
questions = ["Which tool gives the price of a lamp?", "What does owner_of return?", "Name two tools.", "Which tool checks customs?",
             "How many tools are there?", "Which tool would you call for a chair's weight?"]
with open(f"{work}/tail.jsonl", "w") as f:
    for i, q in enumerate(questions):
        msgs = [{"role": "system", "content": "You are a careful shop assistant."}, {"role": "user", "content": schema},
                {"role": "user", "content": q}]
        f.write(json.dumps({"id": f"t{i}", "messages": msgs, "max_tokens": 24}) + "\n")
systems = ["You are agent one.", "You are agent two. Be brief and precise.", "You are the third agent; think step by step and check your facts."]
with open(f"{work}/shifted.jsonl", "w") as f:
    for i, s in enumerate(systems):
        msgs = [{"role": "system", "content": s}, {"role": "user", "content": schema}, {"role": "user", "content": questions[i]}]
        f.write(json.dumps({"id": f"s{i}", "messages": msgs, "max_tokens": 16}) + "\n")
    f.write(json.dumps({"id": "bad", "prompt": "hello", "segment_reuse": "sometimes"}) + "\n")
PY

field_sum() { python3 -c 'import json,sys; print(sum(json.loads(l).get(sys.argv[2], 0) for l in open(sys.argv[1])))' "$1" "$2"; }
texts_equal() { python3 -c 'import json,sys; a=[json.loads(l)["text"] for l in open(sys.argv[1])]; b=[json.loads(l)["text"] for l in open(sys.argv[2])]; sys.exit(0 if a == b and len(a) > 0 else 1)' "$1" "$2"; }

run_batch() {  # run_batch NAME INPUT ARGS...
  local name=$1 input=$2; shift 2
  "$braid" batch --model "$model" --input "$input" --output "$work/$name.jsonl" --max-running 1 --threads 2 "$@" \
    2> "$work/$name.err" > /dev/null || { fail "batch $name exited $?"; cat "$work/$name.err"; }
}

run_batch off "$work/tail.jsonl" --segment-reuse off
run_batch exact "$work/tail.jsonl" --segment-reuse exact
check "exact: greedy outputs equal the run without reuse" texts_equal "$work/off.jsonl" "$work/exact.jsonl"
check "exact: some prompt tokens reused" [ "$(field_sum "$work/exact.jsonl" segment_reused_tokens)" -gt 0 ]
check "off: nothing reused" [ "$(field_sum "$work/off.jsonl" segment_reused_tokens)" = 0 ]
check "exact: the summary counts exact admissions" grep -qE "segment reuse exact: [0-9]+ candidates, [1-9][0-9]* exact" "$work/exact.err"

run_batch approx "$work/shifted.jsonl" --segment-reuse approx --approx-window 0 --segment-probe-tokens 0
reused=$(field_sum "$work/approx.jsonl" segment_reused_tokens)
check "approx: the shifted schema is reused ($reused tokens)" [ "$reused" -gt 100 ]
check "approx: reuse is not counted as cached" [ "$(field_sum "$work/approx.jsonl" cached_tokens)" -lt "$reused" ]
check "approx: a bad segment_reuse value rejects its line" grep -q '"id":"bad".*segment_reuse must be' "$work/approx.jsonl"
run_batch exact_shifted "$work/shifted.jsonl" --segment-reuse exact
check "exact: the shifted schema is not reused (its left context differs)" \
  [ "$(field_sum "$work/exact_shifted.jsonl" segment_reused_tokens)" = 0 ]
"$braid" batch --model "$model" --input "$work/shifted.jsonl" --output /dev/null --segment-reuse sometimes > /dev/null 2> "$work/badflag.err"
check "batch: --segment-reuse sometimes is refused" grep -q "expects off, exact or approx" "$work/badflag.err"

# ---- braid sim on a trace with token ids ----
bench_bin=$(dirname "$braid")/braid-bench
"$bench_bin" gen --workload templates --workflows 6 --concurrency 3 --scale 0.5 --model "$model" --out "$work/t.trace" \
  --trace-tokens 2> /dev/null
"$bench_bin" gen --workload templates --workflows 6 --concurrency 3 --scale 0.5 --model "$model" --out "$work/nt.trace" 2> /dev/null
sim_reused() { "$braid" sim --trace "$1" --kv-tokens 100000 --model "$model" --json "${@:2}" 2> /dev/null | tail -1 |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["segment_reused_tokens"])'; }
sim_exact=$(sim_reused "$work/t.trace" --segment-reuse exact)
sim_approx=$(sim_reused "$work/t.trace" --segment-reuse approx --approx-window 0)
check "sim: approx reuses the shifted templates ($sim_approx tokens), far more than exact ($sim_exact)" \
  [ "${sim_approx:-0}" -gt 1000 ] && [ "${sim_approx:-0}" -gt "$(( ${sim_exact:-0} * 10 ))" ]
"$braid" sim --trace "$work/nt.trace" --kv-tokens 100000 --model "$model" --segment-reuse exact > /dev/null 2> "$work/sim.err"
check "sim: a trace without token ids is refused with a hint" grep -q -- "--trace-tokens" "$work/sim.err"

# ---- served ----
chat_body() {  # chat_body LINE_NUMBER EXTRA_JSON -> a chat request from the shifted suite
  python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readlines()[int(sys.argv[2])]); r.pop("id"); r.update(json.loads(sys.argv[3])); print(json.dumps(r))' \
    "$work/shifted.jsonl" "$1" "$2"
}
post() { curl -s -o "$work/body" -w '%{http_code}' "$url/v1/chat/completions" -H 'Content-Type: application/json' --data-binary "$1"; }
usage_reused() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens_details"]["segment_reused_tokens"])' "$work/body"; }

if start_cluster exact --threads 2; then
  check "served (exact server): approx refused with 400" [ "$(post "$(chat_body 0 '{"segment_reuse": "approx"}')")" = 400 ]
  check "served: the 400 names segment_reuse" grep -q segment_reuse "$work/body"
  check "served: an unknown mode is a 400" [ "$(post "$(chat_body 0 '{"segment_reuse": 3}')")" = 400 ]
  check "served: usage carries segment_reused_tokens" [ "$(post "$(chat_body 0 '{}')")" = 200 ] && usage_reused > /dev/null
  stop_cluster exact
fi
if start_cluster approx --threads 2 --segment-reuse approx --approx-window 0 --segment-probe-tokens 0; then
  post "$(chat_body 0 '{"segment_reuse": "approx"}')" > /dev/null
  status=$(post "$(chat_body 1 '{"segment_reuse": "approx"}')")
  got=$(usage_reused 2> /dev/null || echo 0)
  check "served approx: 200 and the schema reused ($got tokens)" [ "$status" = 200 ] && [ "$got" -gt 100 ]
  status=$(post "$(chat_body 2 '{}')")
  check "served approx server: a request without the field gets no approximate reuse" [ "$(usage_reused)" = 0 ]
  sleep 2.5 # a stats report
  curl -s "$url/metrics" > "$work/metrics"
  check "metrics: candidates counted" grep -qE '^braid_segment_candidates_total [1-9]' "$work/metrics"
  check "metrics: approx admissions counted" grep -qE '^braid_segment_admissions_total\{mode="approx"\} [1-9]' "$work/metrics"
  check "metrics: reused prompt tokens" grep -qE '^braid_prompt_tokens_segment_reused_total [1-9]' "$work/metrics"
  check "metrics: FLOPs saved" grep -qE '^braid_segment_prefill_flops_saved_total [1-9]' "$work/metrics"
  stop_cluster approx
fi

echo "$failures failure(s)"
[ "$failures" = 0 ]
