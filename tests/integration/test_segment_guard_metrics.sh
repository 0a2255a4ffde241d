#!/usr/bin/env bash
# Approximate segment guards in /metrics (issue 35), end to end with the real model and `braid serve`:
# a tool schema is served after one system prompt, then after others (approximate spans: each is
# probed) and with one tool line edited (a near-duplicate chunk: the LSH index finds a candidate).
# The instances' counters reach the coordinator: braid_segment_probe_total{result=...} and
# braid_segment_lsh_candidates_total move, per instance and summed; admissions never exceed candidates.
# Usage: test_segment_guard_metrics.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

body() {  # body SYSTEM_PROMPT EDITED(0|1) -> a chat request asking for approximate reuse
  python3 - "$1" "$2" <<'PY'
import json, sys
tools = [("price_of", "price", "stock"), ("weight_of", "weight", "shipping"), ("owner_of", "owner", "registry"),
         ("origin_of", "origin", "customs"), ("rating_of", "rating", "review"), ("color_of", "color", "catalog"),
         ("size_of", "size", "warehouse"), ("maker_of", "maker", "supplier")]
lines = [f"- {n}(item: string, limit: int): returns the {w} of the item, checked against the {c} record" for n, w, c in tools]
if sys.argv[2] == "1":
    lines[-2] = lines[-2].replace("warehouse", "depot")
msgs = [{"role": "system", "content": sys.argv[1]}, {"role": "user", "content": "Tools you may call:\n" + "\n".join(lines)},
        {"role": "user", "content": "Which tool gives the price of a lamp?"}]
print(json.dumps({"messages": msgs, "max_tokens": 4, "segment_reuse": "approx"}))
PY
}
post() { curl -s -o "$work/body" -w '%{http_code}' "$url/v1/chat/completions" -H 'Content-Type: application/json' --data-binary "$1"; }
probes() {  # admitted + rejected probes, summed over instances (0 while the series are absent)
  local a r
  a=$(metric 'braid_segment_probe_total{result="admitted"}'); r=$(metric 'braid_segment_probe_total{result="rejected"}')
  echo $(( ${a:-0} + ${r:-0} ))
}
probed() { [ "$(probes)" -gt 0 ]; }

if start_cluster guarded --threads 2 --segment-reuse approx --approx-window 0 --segment-min-span 0 --segment-tail 0 --segment-lsh on --segment-tau-seg 0.3 --segment-tau-ctx 0; then
  cand0=$(metric braid_segment_lsh_candidates_total)
  check "guarded: probe and LSH counters start at 0" [ "$(probes)" = 0 ] && [ "${cand0:-0}" = 0 ]
  check "guarded: source request" [ "$(post "$(body 'You are agent one.' 0)")" = 200 ]
  check "guarded: shifted request" [ "$(post "$(body 'You are agent two. Be brief and precise, and check every tool twice.' 0)")" = 200 ]
  check "guarded: shifted and edited request" [ "$(post "$(body 'You are the third agent; think step by step.' 1)")" = 200 ]
  wait_for 10 probed # the next stats report
  curl -s "$url/metrics" > "$work/metrics"
  grep -E '^braid(_instance)?_segment_(probe|lsh)' "$work/metrics"
  check "metrics: probes counted by result (summed)" \
    [ "$(awk '$1 ~ /^braid_segment_probe_total\{result="(admitted|rejected)"\}$/ {s += $2} END {print s + 0}' "$work/metrics")" -gt 0 ]
  check "metrics: probes per instance" grep -qE '^braid_instance_segment_probe_total\{instance="0",result="(admitted|rejected)"\} [1-9]' "$work/metrics"
  check "metrics: LSH candidates counted" grep -qE '^braid_segment_lsh_candidates_total [1-9]' "$work/metrics"
  cand=$(awk '$1 == "braid_segment_lsh_candidates_total" {print $2}' "$work/metrics")
  adm=$(awk '$1 == "braid_segment_lsh_admitted_total" {print $2}' "$work/metrics")
  check "metrics: LSH admissions ($adm) never exceed candidates ($cand)" [ -n "$adm" ] && [ "$adm" -le "$cand" ]
  stop_cluster guarded
fi

echo "$failures failure(s)"
[ "$failures" = 0 ]
