#!/usr/bin/env bash
# Segment reuse live (issue 17): TTFT through the server with approximate segment reuse on vs off,
# at client concurrency 1 and 16, side by side on one server (the same instance serves both
# rounds: the requests of a round carry "segment_reuse": "approx" or "off"; the cache is warmed
# by a first pass of the same workload with other workflow seeds so both rounds start alike).
# Usage: bench/segment_reuse_live.sh [OUT_DIR]  (env: WORKFLOWS=8 SCALE=0.5 WINDOW=16 MAX_TOKENS=8
#        CONCURRENCY="1 16" WORKLOAD=templates APPEND=1)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/segment_reuse_live}
workflows=${WORKFLOWS:-8}
scale=${SCALE:-0.5}
window=${WINDOW:-16}
max_tokens=${MAX_TOKENS:-8}
concurrency=${CONCURRENCY:-1 16}
workload=${WORKLOAD:-templates}
mkdir -p "$out"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port

for seed in 1 2; do
  "$bench" gen --workload "$workload" --workflows "$workflows" --concurrency 4 --scale "$scale" --seed "$seed" --model "$model" \
    --out "$out/gen$seed.trace" --batch-out "$out/gen$seed.jsonl" 2> /dev/null
done
for mode in off approx; do
  python3 - "$out/gen1.jsonl" "$out/$mode.jsonl" "$mode" "$max_tokens" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        r = json.loads(line); r["max_tokens"] = int(sys.argv[4]); r["segment_reuse"] = sys.argv[3]
        f.write(json.dumps(r) + "\n")
PY
done
python3 - "$out/gen2.jsonl" "$out/warm.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        r = json.loads(line); r["max_tokens"] = 1; r["id"] = "warm-" + r["id"]; r["segment_reuse"] = "approx"
        f.write(json.dumps(r) + "\n")
PY

BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --segment-reuse approx --approx-window "$window" \
  > "$out/server.out" 2> "$out/server.err" &
server=$!
trap 'kill -TERM $server 2> /dev/null; wait $server 2> /dev/null' EXIT
for _ in $(seq 1 240); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && break; sleep 0.5; done

table="$out/table.md"
echo "| concurrency | segment reuse | requests | TTFT mean ms | TTFT p50 ms | TTFT p90 ms | reused prompt tokens | prompt tokens |" > "$table"
echo "|---:|---|---:|---:|---:|---:|---:|---:|" >> "$table"
for c in $concurrency; do
  for mode in off approx; do
    "$bench" replay --url "$url" --input "$out/warm.jsonl" --out "$out/warm.out" --concurrency "$c" 2> /dev/null
    "$bench" replay --url "$url" --input "$out/$mode.jsonl" --out "$out/$mode.c$c.out" --concurrency "$c" 2> "$out/$mode.c$c.err"
    python3 - "$out/$mode.c$c.out" "$c" "$mode" >> "$table" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ok = [r for r in rows if "error" not in r]
t = sorted(r["ttft_ms"] - r["sent_ms"] for r in ok)  # each request's own TTFT
pct = lambda q: t[min(len(t) - 1, int(q * len(t)))]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {len(ok)} | {sum(t) / len(t):.0f} | {pct(0.5):.0f} | {pct(0.9):.0f} | "
      f"{sum(r.get('segment_reused_tokens', 0) for r in ok)} | {sum(r['prompt_tokens'] for r in ok)} |")
PY
  done
done
cat "$table"
if [ "${APPEND:-1}" = 1 ]; then
  {
    echo
    echo "### Segment reuse live, TTFT ($(date -u +%Y-%m-%d), $(nproc) cores: $(lscpu | sed -n 's/^Model name: *//p'))"
    echo
    echo "Command: \`WORKFLOWS=$workflows SCALE=$scale WINDOW=$window MAX_TOKENS=$max_tokens WORKLOAD=$workload bench/segment_reuse_live.sh\`"
    echo
    cat "$table"
  } >> "$root/bench/RESULTS.md"
fi
