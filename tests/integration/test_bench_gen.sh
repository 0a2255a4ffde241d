#!/usr/bin/env bash
# `braid-bench gen` end to end: every workload writes a sorted, deterministic trace with one
# workflow_end per workflow, tokenized with the real model's tokenizer, that `braid sim` replays;
# usage errors exit 2 with a message. `braid sim --timeline` writes one row per request that add up
# to its totals, and `braid-bench plot` draws such files (when gnuplot is installed). Usage: test_bench_gen.sh BRAID_BENCH_BINARY BRAID_BINARY MODEL_PATH
set -u
bench=$1
braid=$2
model=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

check() { # check NAME CONDITION-COMMAND...
  local name=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "ok   $name"; else failed=$((failed + 1)); echo "FAIL $name"; fi
}
contains() { grep -qF -- "$2" "$1"; }
exit_code_is() { [ "$1" = "$2" ]; }

# Checks a trace: times never decrease, seq counts requests 0..n-1, each workflow ends once after
# its last request, prompts fit the model's context. Prints "requests workflows max_prompt_tokens".
trace_facts() {
  python3 - "$1" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
t = [l["t"] for l in lines]
assert t == sorted(t), "arrival times out of order"
req = [l for l in lines if l["type"] == "request"]
assert [r["seq"] for r in req] == list(range(len(req))), "seq is not the arrival order"
last = {}
for r in req:
    last[r["workflow"]] = r["t"]
    assert len(r["blocks"]) == r["prompt_tokens"] // r["block_size"]
ends = [l for l in lines if l["type"] == "workflow_end"]
assert sorted(e["workflow"] for e in ends) == sorted(last), "workflow_end lines do not match the workflows"
assert all(e["t"] >= last[e["workflow"]] for e in ends), "a workflow ends before its last request"
print(len(req), len(ends), max(r["prompt_tokens"] for r in req))
PY
}

# --help is true and complete
"$bench" --help > "$tmp/help" 2>&1; rc=$?
check "braid-bench --help exits 0" exit_code_is "$rc" 0
check "braid-bench --help lists gen" contains "$tmp/help" "gen"
"$bench" gen --help > "$tmp/gen_help" 2>&1; rc=$?
check "gen --help exits 0" exit_code_is "$rc" 0
workloads="codegen factcheck pipeline react-lora mapreduce-lora edit-replay cross-tenant templates"
for w in $workloads; do check "gen --help lists $w" contains "$tmp/gen_help" "  $w "; done
for flag in --workload --out --workflows --concurrency --seed --model --block-size --context-tokens --fanout --scale \
            --prefill-ms-per-token --decode-ms-per-token; do
  check "gen --help documents $flag" contains "$tmp/gen_help" "$flag"
done

# usage errors: exit 2 with a message naming the problem
"$bench" gen --workload nope --out "$tmp/x.jsonl" --model "$model" > "$tmp/err1" 2>&1; rc=$?
check "unknown workload exits 2" exit_code_is "$rc" 2
check "unknown workload is named" contains "$tmp/err1" "unknown workload 'nope'"
"$bench" gen --workload codegen --model "$model" > "$tmp/err2" 2>&1; rc=$?
check "missing --out exits 2" exit_code_is "$rc" 2
check "missing --out is said" contains "$tmp/err2" "--out"
"$bench" gen --workload codegen --out "$tmp/x.jsonl" --workflows 0 > "$tmp/err3" 2>&1; rc=$?
check "--workflows 0 exits 2" exit_code_is "$rc" 2
check "--workflows range is said" contains "$tmp/err3" "--workflows expects an integer"
"$bench" gen --workload codegen --out "$tmp/x.jsonl" --scale abc > "$tmp/err4" 2>&1; rc=$?
check "bad --scale exits 2" exit_code_is "$rc" 2
"$bench" gen --workload codegen --out "$tmp/x.jsonl" --model "$tmp/missing.gguf" > "$tmp/err5" 2>&1; rc=$?
check "missing model exits 1" exit_code_is "$rc" 1
check "missing model is named" contains "$tmp/err5" "missing.gguf"

# every workload: a small run, replayed by braid sim
for w in $workloads; do
  out="$tmp/$w.jsonl"
  "$bench" gen --workload "$w" --workflows 6 --concurrency 3 --seed 7 --scale 0.2 --model "$model" --out "$out" \
    > /dev/null 2> "$tmp/$w.err"; rc=$?
  check "gen $w exits 0" exit_code_is "$rc" 0
  check "gen $w prints a summary" contains "$tmp/$w.err" "[gen] $w: 6 workflows"
  facts=$(trace_facts "$out" 2> "$tmp/$w.facts_err"); rc=$?
  check "gen $w trace is sorted and complete" exit_code_is "$rc" 0
  read -r requests workflows _ <<< "$facts"
  check "gen $w has 6 workflow ends" exit_code_is "${workflows:-0}" 6
  "$braid" sim --trace "$out" --kv-tokens 8192 --policy lru --json > "$tmp/$w.sim" 2> /dev/null; rc=$?
  check "sim replays $w (lru)" exit_code_is "$rc" 0
  check "sim counts every $w request" contains "$tmp/$w.sim" "\"requests\":${requests:-x},"
  "$braid" sim --trace "$out" --kv-tokens 8192 --policy belady --json > /dev/null 2>&1; rc=$?
  check "sim replays $w (belady)" exit_code_is "$rc" 0
done

# deterministic: same seed, same file; another seed, another file; concurrency changes only times
"$bench" gen --workload codegen --workflows 6 --concurrency 3 --seed 7 --scale 0.2 --model "$model" --out "$tmp/again.jsonl" 2> /dev/null
check "same seed, same trace" cmp -s "$tmp/codegen.jsonl" "$tmp/again.jsonl"
"$bench" gen --workload codegen --workflows 6 --concurrency 3 --seed 8 --scale 0.2 --model "$model" --out "$tmp/other.jsonl" 2> /dev/null
check "another seed, another trace" bash -c "! cmp -s '$tmp/codegen.jsonl' '$tmp/other.jsonl'"
# --noise: on is the default's trace byte for byte; off changes codegen (labels, flaky tests; the unit
# test test_workload_noise checks what changes), not pipeline, which has no noise
"$bench" gen --workload codegen --workflows 6 --concurrency 3 --seed 7 --scale 0.2 --model "$model" --noise on --out "$tmp/noisy.jsonl" 2> /dev/null
check "--noise on is the default" cmp -s "$tmp/codegen.jsonl" "$tmp/noisy.jsonl"
for n in on off; do
  "$bench" gen --workload codegen --workflows 30 --concurrency 8 --seed 7 --scale 0.2 --model "$model" --noise $n --out "$tmp/noise-$n.jsonl" 2> /dev/null
  "$bench" gen --workload pipeline --workflows 4 --concurrency 2 --seed 7 --scale 0.2 --model "$model" --noise $n --out "$tmp/pipeline-noise-$n.jsonl" 2> /dev/null
done
check "--noise off changes codegen" bash -c "! cmp -s '$tmp/noise-on.jsonl' '$tmp/noise-off.jsonl'"
check "--noise off leaves pipeline alone" cmp -s "$tmp/pipeline-noise-on.jsonl" "$tmp/pipeline-noise-off.jsonl"
"$bench" gen --workload codegen --workflows 1 --model "$model" --noise maybe --out "$tmp/bad.jsonl" > /dev/null 2>&1; rc=$?
check "--noise takes on or off" exit_code_is "$rc" 2

# sim --prediction-noise (App. E): at 1 every forecast is uniform, so pbkv's replay no longer
# depends on the predictor; at 0 Markov-1 and Markov-2 forecasts evict differently
pbkv_hits() { "$braid" sim --trace "$tmp/noise-on.jsonl" --kv-tokens 4000 --policy pbkv --markov "$1" --prediction-noise "$2" --json 2> /dev/null |
  tail -1 | python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["cached_tokens"], r["evictions"])'; }
m1_clean=$(pbkv_hits 1 0) m2_clean=$(pbkv_hits 2 0) m1_noise=$(pbkv_hits 1 1) m2_noise=$(pbkv_hits 2 1)
check "sim --prediction-noise 0: the predictor matters" bash -c "[ -n '$m1_clean' ] && [ '$m1_clean' != '$m2_clean' ]"
check "sim --prediction-noise 1: uniform forecasts, the predictor does not" bash -c "[ -n '$m1_noise' ] && [ '$m1_noise' = '$m2_noise' ]"
"$braid" sim --trace "$tmp/noise-on.jsonl" --kv-tokens 4000 --prediction-noise 1.5 > /dev/null 2>&1; rc=$?
check "sim --prediction-noise takes [0, 1]" exit_code_is "$rc" 2
"$bench" gen --workload codegen --workflows 6 --concurrency 1 --seed 7 --scale 0.2 --model "$model" --out "$tmp/serial.jsonl" 2> /dev/null
same_requests() {
  python3 - "$1" "$2" <<'PY'
import json, sys
def requests(path):
    return {l["id"]: l["blocks"] for l in map(json.loads, open(path)) if l["type"] == "request"}
sys.exit(0 if requests(sys.argv[1]) == requests(sys.argv[2]) else 1)
PY
}
check "concurrency changes arrival times, not prompts" same_requests "$tmp/codegen.jsonl" "$tmp/serial.jsonl"

# default sizes fit the default model: a 4096-token shared context plus history stays under ~6000 tokens
"$bench" gen --workload react-lora --workflows 3 --concurrency 3 --seed 1 --model "$model" --out "$tmp/full.jsonl" \
  2> "$tmp/full.err"; rc=$?
check "react-lora at scale 1 exits 0" exit_code_is "$rc" 0
read -r _ _ max_prompt <<< "$(trace_facts "$tmp/full.jsonl")"
check "react-lora prompts fit the context (max ${max_prompt:-?} tokens)" test "${max_prompt:-99999}" -le 6200
check "react-lora prompts hold the 4096-token context" test "${max_prompt:-0}" -ge 4096
check "no context warning" bash -c "! grep -q warning '$tmp/full.err'"

# braid sim --lora-cache shared (ForkKV): on a trace with token ids, the second adapter on the shared
# context inherits base blocks (fork tokens > 0, none in separate mode); usage errors exit 2; a trace
# without token ids is refused with the reason
"$bench" gen --workload react-lora --workflows 3 --concurrency 3 --seed 1 --model "$model" --trace-tokens \
  --out "$tmp/lora.jsonl" 2> /dev/null
"$braid" sim --trace "$tmp/lora.jsonl" --kv-tokens 8192 --lora-cache shared --json > "$tmp/shared.sim" 2> /dev/null; rc=$?
check "sim --lora-cache shared exits 0" exit_code_is "$rc" 0
fork_tokens() { tail -1 "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin)["fork_tokens"])'; }
check "sim --lora-cache shared: fork tokens" test "$(fork_tokens "$tmp/shared.sim")" -gt 0
"$braid" sim --trace "$tmp/lora.jsonl" --kv-tokens 8192 --json > "$tmp/separate.sim" 2> /dev/null
check "sim --lora-cache separate (default): no fork tokens" test "$(fork_tokens "$tmp/separate.sim")" -eq 0
"$braid" sim --trace "$tmp/lora.jsonl" --kv-tokens 8192 --lora-cache both > /dev/null 2>&1; rc=$?
check "sim --lora-cache takes separate or shared" exit_code_is "$rc" 2
# --lora-cache auto (issue 36): every adapted request is either forked or separate; ResidualAttention's
# time (--residual-attention cpu) lengthens the forked requests' modeled latency.
"$braid" sim --trace "$tmp/lora.jsonl" --kv-tokens 8192 --lora-cache auto --residual-attention cpu --json > "$tmp/auto.sim" 2> /dev/null; rc=$?
check "sim --lora-cache auto exits 0" exit_code_is "$rc" 0
check "sim --lora-cache auto: forked + separate = adapted requests" python3 -c "
import json
r = json.loads(open('$tmp/auto.sim').read().splitlines()[-1])
lines = [json.loads(l) for l in open('$tmp/lora.jsonl')]
adapted = sum(1 for o in lines if o.get('type') == 'request' and o.get('adapter'))
assert adapted > 0 and r['forked_requests'] + r['separate_adapted_requests'] == adapted, (r['forked_requests'], r['separate_adapted_requests'], adapted)"
"$braid" sim --trace "$tmp/lora.jsonl" --kv-tokens 8192 --lora-cache shared --residual-attention cpu --json > "$tmp/shared_cpu.sim" 2> /dev/null
check "sim --residual-attention cpu charges forked requests" python3 -c "
import json
a, b = (json.loads(open(p).read().splitlines()[-1]) for p in ('$tmp/shared.sim', '$tmp/shared_cpu.sim'))
assert b['fork_attention_s'] > 0 and abs(b['modeled_latency_s'] - a['modeled_latency_s'] - b['fork_attention_s']) < 1e-6, (a, b)"
"$braid" sim --trace "$tmp/lora.jsonl" --kv-tokens 8192 --lora-cache shared --residual-attention fast > /dev/null 2>&1; rc=$?
check "sim --residual-attention rejects an unknown value" exit_code_is "$rc" 2
"$braid" sim --trace "$tmp/full.jsonl" --kv-tokens 8192 --lora-cache shared > /dev/null 2> "$tmp/notokens.err"; rc=$?
check "sim --lora-cache shared needs token ids" bash -c "[ $rc -eq 1 ] && grep -q 'trace-tokens' '$tmp/notokens.err'"

# braid sim --timeline: a header, then one row per request whose tokens add up to the JSON totals
"$braid" sim --trace "$tmp/codegen.jsonl" --kv-tokens 4096 --policy lru --json --timeline "$tmp/lru.timeline.jsonl" \
  > "$tmp/lru.sim" 2> /dev/null; rc=$?
check "sim --timeline exits 0" exit_code_is "$rc" 0
timeline_matches() {
  python3 - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
total = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
assert rows[0]["type"] == "sim_timeline" and rows[0]["policy"] == "lru", rows[0]
req = rows[1:]
assert all(r["type"] == "request" for r in req)
assert len(req) == total["requests"], (len(req), total["requests"])
assert sum(r["prompt_tokens"] for r in req) == total["prompt_tokens"]
assert sum(r["cached_tokens"] for r in req) == total["cached_tokens"]
assert [r["t"] for r in req] == sorted(r["t"] for r in req)
PY
}
check "sim --timeline rows add up to the totals" timeline_matches "$tmp/lru.timeline.jsonl" "$tmp/lru.sim"
"$braid" sim --trace "$tmp/codegen.jsonl" --kv-tokens 4096 --policy belady --timeline "$tmp/belady.timeline.jsonl" \
  > /dev/null 2>&1
if command -v gnuplot > /dev/null; then
  "$bench" plot "$tmp/lru.timeline.jsonl" "Belady bound=$tmp/belady.timeline.jsonl" --out "$tmp/timeline.png" \
    --title "sim timelines" 2> "$tmp/plot.err"; rc=$?
  check "plot draws sim timelines" exit_code_is "$rc" 0
  check "plot wrote a non-empty PNG from timelines" python3 -c 'import sys; d = open(sys.argv[1], "rb").read(); assert len(d) > 1000 and d[:8] == b"\x89PNG\r\n\x1a\n"' "$tmp/timeline.png"
else
  echo "skip plot of sim timelines: gnuplot is not installed"
fi
"$bench" plot "$tmp/missing.timeline.jsonl" --out "$tmp/none.png" > /dev/null 2>&1; rc=$?
check "plot of a missing input fails" bash -c "[ $rc != 0 ]"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
