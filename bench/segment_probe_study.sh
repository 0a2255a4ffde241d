#!/usr/bin/env bash
# Segment reuse guards study (issue 35): drift and prefill saved of approximate segment reuse with
# the depth-aware head (--approx-window-deep) and the online probe (--segment-probe-tokens,
# --segment-probe-min-cos) against the same calls without reuse, on the real model through
# `braid batch` (greedy, MAX_TOKENS each, at most MAX_RUNNING at once, first-token logits kept).
# Reported per configuration: prompt tokens, prefix-cached, segment-reused (after the guards took
# back heads and rejected spans), first-token and MAX_TOKENS-token agreement with no reuse, KL of
# the first token's distribution, probes accepted / rejected (from the scheduler's events).
# Usage: bench/segment_probe_study.sh [OUT_DIR]   (env: WORKFLOWS=4 SCALE=0.5 MAX_TOKENS=16
#        MAX_RUNNING=4 WINDOW=64 WORKLOADS="templates codegen" THREADS=2
#        CONFIGS="unguarded:0:0:0.99 probe:4:0:0.99" (NAME:PROBE_TOKENS:DEEP_WINDOW:MIN_COS))
# Prints a Markdown table; never edits RESULTS.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/segment_probe}
workflows=${WORKFLOWS:-4}
scale=${SCALE:-0.5}
max_tokens=${MAX_TOKENS:-16}
max_running=${MAX_RUNNING:-4}
window=${WINDOW:-64}
workloads=${WORKLOADS:-templates codegen}
threads=${THREADS:-2}
configs=${CONFIGS:-unguarded:0:0:0.99 probe:4:0:0.99}
mkdir -p "$out"

run_config() {  # run_config WORKLOAD NAME ARGS...
  local wl=$1 name=$2; shift 2
  echo "[probe-study] $wl: $name" >&2
  local t0=$SECONDS
  "$braid" batch --model "$model" --input "$out/$wl.in.jsonl" --output "$out/$wl.$name.jsonl" --logits-out "$out/$wl.$name.logits" \
    --events "$out/$wl.$name.events" --max-running "$max_running" --threads "$threads" "$@" 2> "$out/$wl.$name.err" > /dev/null
  echo "$((SECONDS - t0))" > "$out/$wl.$name.secs"
}

for wl in $workloads; do
  if [ ! -s "$out/$wl.in.jsonl" ]; then
    "$bench" gen --workload "$wl" --workflows "$workflows" --concurrency 4 --scale "$scale" --model "$model" \
      --out "$out/$wl.trace" --batch-out "$out/$wl.batch.jsonl" 2> "$out/$wl.gen.err"
    python3 - "$out/$wl.batch.jsonl" "$out/$wl.in.jsonl" "$max_tokens" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        r = json.loads(line); r["max_tokens"] = int(sys.argv[3]); r.pop("segment_reuse", None)
        f.write(json.dumps(r) + "\n")
PY
  fi
  [ -s "$out/$wl.off.jsonl" ] || run_config "$wl" off --segment-reuse off
  for c in $configs; do
    IFS=: read -r name probe deep cos <<< "$c"
    run_config "$wl" "$name" --segment-reuse approx --approx-window "$window" --segment-probe-tokens "$probe" \
      --approx-window-deep "$deep" --segment-probe-min-cos "$cos"
  done
done

python3 - "$out" "$max_tokens" "$window" "$workloads" "$configs" > "$out/table.md" <<'PY'
import base64, json, math, struct, sys
out, max_tokens, window, workloads, configs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5].split()
def rows(path): return {r["id"]: r for r in map(json.loads, open(path))}
def logits(path):
    d = {}
    for line in open(path):
        r = json.loads(line); raw = base64.b64decode(r["logits"])
        d[r["id"]] = struct.unpack(f"<{len(raw)//4}f", raw)
    return d
def log_softmax(x):
    m = max(x); s = math.log(sum(math.exp(v - m) for v in x)) + m
    return [v - s for v in x]
def kl(p, q):
    lp, lq = log_softmax(p), log_softmax(q)
    return sum(math.exp(a) * (a - b) for a, b in zip(lp, lq))
def probes(path):
    ok = rej = 0
    try:
        for line in open(path):
            if '"probe_ok"' in line: ok += 1
            elif '"probe_rejected"' in line: rej += 1
    except FileNotFoundError: pass
    return ok, rej
argmax = lambda x: max(range(len(x)), key=x.__getitem__)
print(f"| workload | config | W | probe tokens | deep W | min cos | prompt tokens | prefix-cached | segment-reused | prefill saved by reuse | first-token agreement | {max_tokens}-token agreement | KL mean | KL max | probes ok / rejected | run s |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for wl in workloads:
    base = rows(f"{out}/{wl}.off.jsonl"); base_l = logits(f"{out}/{wl}.off.logits")
    for c in configs:
        name, probe, deep, cos = c.split(":")
        r = rows(f"{out}/{wl}.{name}.jsonl"); l = logits(f"{out}/{wl}.{name}.logits")
        ids = [i for i in base if "error" not in base[i] and "error" not in r.get(i, {"error": 1})]
        prompt = sum(base[i]["prompt_tokens"] for i in ids)
        cached = sum(r[i]["cached_tokens"] for i in ids)
        reused = sum(r[i].get("segment_reused_tokens", 0) for i in ids)
        first = sum(1 for i in ids if i in l and argmax(base_l[i]) == argmax(l[i])) / len(ids)
        full = sum(1 for i in ids if base[i]["text"] == r[i]["text"]) / len(ids)
        kls = [kl(base_l[i], l[i]) for i in ids if i in l and i in base_l] or [0.0]
        ok, rej = probes(f"{out}/{wl}.{name}.events")
        secs = open(f"{out}/{wl}.{name}.secs").read().strip()
        print(f"| {wl} | {name} | {window} | {probe} | {deep} | {cos} | {prompt} | {cached} | {reused} | {100 * reused / prompt:.1f}% | "
              f"{100 * first:.1f}% | {100 * full:.1f}% | {sum(kls) / len(kls):.4f} | {max(kls):.4f} | {ok} / {rej} | {secs} |")
PY
cat "$out/table.md"
