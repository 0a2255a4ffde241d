#!/usr/bin/env bash
# Segment reuse study (issue 17): prefill FLOPs saved and drift, exact vs approximate at several
# windows, on real model runs of two workloads (templates: tool schemas and preambles at shifted
# positions; codegen: agent tool preambles and a sliding history window).
#
# For each workload, `braid-bench gen --batch-out` writes the calls in arrival order; `braid batch`
# serves them with --segment-reuse off, exact, and approx at each window, greedy, MAX_TOKENS each,
# at most MAX_RUNNING at once (so earlier calls are in the cache when later ones arrive, as in a
# served run), keeping each call's first-token logits. Reported per configuration:
#   - prefill FLOPs saved: reused prompt tokens x the linear layers' FLOPs per token (what `braid`
#     reports), as a share of all prompt tokens' FLOPs, and the share prefix caching alone saves;
#   - drift against the run without reuse: greedy agreement of the first token and of the whole
#     MAX_TOKENS continuation, mean and max KL(full || reuse) of the first-token distribution.
# Usage: bench/segment_reuse_study.sh [OUT_DIR]   (env: WORKFLOWS=8 SCALE=0.5 MAX_TOKENS=16
#        MAX_RUNNING=4 WINDOWS="0 16 64 256" WORKLOADS="templates codegen" THREADS=2 APPEND=1)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/segment_reuse}
workflows=${WORKFLOWS:-8}
scale=${SCALE:-0.5}
max_tokens=${MAX_TOKENS:-16}
max_running=${MAX_RUNNING:-4}
windows=${WINDOWS:-0 16 64 256}
workloads=${WORKLOADS:-templates codegen}
threads=${THREADS:-2}
mkdir -p "$out"

run_config() {  # run_config WORKLOAD NAME ARGS...
  local wl=$1 name=$2; shift 2
  echo "[study] $wl: $name" >&2
  local t0=$SECONDS
  "$braid" batch --model "$model" --input "$out/$wl.in.jsonl" --output "$out/$wl.$name.jsonl" --logits-out "$out/$wl.$name.logits" \
    --max-running "$max_running" --threads "$threads" "$@" 2> "$out/$wl.$name.err" > /dev/null
  echo "$((SECONDS - t0))" > "$out/$wl.$name.secs"
}

for wl in $workloads; do
  "$bench" gen --workload "$wl" --workflows "$workflows" --concurrency 4 --scale "$scale" --model "$model" \
    --out "$out/$wl.trace" --batch-out "$out/$wl.batch.jsonl" 2> "$out/$wl.gen.err"
  python3 - "$out/$wl.batch.jsonl" "$out/$wl.in.jsonl" "$max_tokens" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        r["max_tokens"] = int(sys.argv[3])
        r.pop("segment_reuse", None)
        f.write(json.dumps(r) + "\n")
PY
  run_config "$wl" off --segment-reuse off
  run_config "$wl" exact --segment-reuse exact
  for w in $windows; do run_config "$wl" "approx_w$w" --segment-reuse approx --approx-window "$w"; done
done

python3 - "$out" "$max_tokens" "$windows" "$workloads" "$braid" > "$out/table.md" <<'PY'
import base64, json, math, struct, sys
out, max_tokens, windows, workloads = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
def rows(path): return {r["id"]: r for r in map(json.loads, open(path))}
def logits(path):
    d = {}
    for line in open(path):
        r = json.loads(line)
        raw = base64.b64decode(r["logits"])
        d[r["id"]] = struct.unpack(f"<{len(raw)//4}f", raw)
    return d
def log_softmax(x):
    m = max(x); s = math.log(sum(math.exp(v - m) for v in x)) + m
    return [v - s for v in x]
def kl(p_logits, q_logits):
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return sum(math.exp(a) * (a - b) for a, b in zip(lp, lq))
def flops_line(err_path):
    for line in open(err_path):
        if "segment reuse" in line and "prompt tokens" in line: return line.strip()
    return ""
print("| workload | mode | W | prompt tokens | prefix-cached | segment-reused | FLOPs saved by reuse | saved with prefix cache | first-token agreement | %s-token agreement | KL mean | KL max | run s |" % max_tokens)
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for wl in workloads:
    base = rows(f"{out}/{wl}.off.jsonl"); base_l = logits(f"{out}/{wl}.off.logits")
    configs = [("off", "", "off"), ("exact", "", "exact")] + [(f"approx_w{w}", w, "approx") for w in windows]
    for name, w, mode in configs:
        r = rows(f"{out}/{wl}.{name}.jsonl"); l = logits(f"{out}/{wl}.{name}.logits") if name != "off" else base_l
        ids = [i for i in base if "error" not in base[i] and "error" not in r.get(i, {"error": 1})]
        prompt = sum(base[i]["prompt_tokens"] for i in ids)
        cached = sum(r[i]["cached_tokens"] for i in ids)
        reused = sum(r[i].get("segment_reused_tokens", 0) for i in ids)
        argmax = lambda x: max(range(len(x)), key=x.__getitem__)
        first = sum(1 for i in ids if i in l and argmax(base_l[i]) == argmax(l[i])) / len(ids)
        full = sum(1 for i in ids if base[i]["text"] == r[i]["text"]) / len(ids)
        kls = [kl(base_l[i], l[i]) for i in ids if i in l and i in base_l] if name != "off" else [0.0]
        secs = open(f"{out}/{wl}.{name}.secs").read().strip()
        print(f"| {wl} | {mode} | {w} | {prompt} | {cached} | {reused} | {100 * reused / prompt:.1f}% | {100 * (cached + reused) / prompt:.1f}% | "
              f"{100 * first:.1f}% | {100 * full:.1f}% | {sum(kls) / len(kls):.4f} | {max(kls):.4f} | {secs} |")
PY
cat "$out/table.md"
if [ "${APPEND:-1}" = 1 ]; then
  {
    echo
    echo "### Segment reuse study ($(date -u +%Y-%m-%d), $(nproc) cores: $(lscpu | sed -n 's/^Model name: *//p'))"
    echo
    echo "Command: \`WORKFLOWS=$workflows SCALE=$scale MAX_TOKENS=$max_tokens MAX_RUNNING=$max_running WINDOWS=\"$windows\" bench/segment_reuse_study.sh\`"
    echo
    cat "$out/table.md"
  } >> "$root/bench/RESULTS.md"
fi
