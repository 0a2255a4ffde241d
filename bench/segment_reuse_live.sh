#!/usr/bin/env bash
# Segment reuse live (issue 17): TTFT through the server with approximate segment reuse on vs off,
# at client concurrency 1 and 16. Every round runs on a fresh server (--segment-reuse approx): a
# warm-up pass of the same workload with other workflow seeds (reuse off, so the cache and segment
# index are alike for both rounds), then the measured requests carrying "segment_reuse": "off" or
# "approx".
# Usage: bench/segment_reuse_live.sh [--device cpu|cuda] [OUT_DIR]  (env: WORKFLOWS=8 SCALE=0.5 WINDOW=16
#        MAX_TOKENS=8 CONCURRENCY="1 16" WORKLOAD=templates APPEND=1 MODES="off approx" (any of off exact
#        approx; the server allows approx, which includes exact) DEVICE=cpu SERVE_ARGS="" (more
#        braid-local flags, e.g. --kv-blocks 4096); BRAID_MODEL may be synthetic:NAME[:TOKENIZER])
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
device=${DEVICE:-cpu}
if [ "${1:-}" = --device ]; then device=${2:?--device needs cpu or cuda}; shift 2; fi
modes=${MODES:-off approx}
serve_args=${SERVE_ARGS:-}
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
for mode in $modes; do
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
        r = json.loads(line); r["max_tokens"] = 1; r["id"] = "warm-" + r["id"]; r["segment_reuse"] = "off"
        f.write(json.dumps(r) + "\n")
PY

start_server() {
  # shellcheck disable=SC2086 # SERVE_ARGS: several flags
  BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --device "$device" --segment-reuse approx \
    --approx-window "$window" $serve_args > "$out/server.out" 2> "$out/server.err" &
  server=$!
  local ready=0
  for _ in $(seq 1 240); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && { ready=1; break; }
    kill -0 "$server" 2> /dev/null || break
    sleep 0.5
  done
  [ "$ready" = 1 ] || { echo "segment_reuse_live: the server did not come up:" >&2; tail -20 "$out/server.err" >&2; exit 1; }
}
stop_server() { kill -TERM "$server" 2> /dev/null; wait "$server" 2> /dev/null || true; server=""; }
server=""
trap '[ -n "$server" ] && stop_server' EXIT

table="$out/table.md"
echo "| concurrency | segment reuse | requests | TTFT mean ms | TTFT p50 ms | TTFT p90 ms | reused prompt tokens | prefix-cached tokens | prompt tokens |" > "$table"
echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|" >> "$table"
# Each round on a fresh server: the warm-up pass (other workflows of the same workload, reuse off, so
# both rounds start from the same cache and index), then the measured requests with reuse off or approx.
for c in $concurrency; do
  for mode in $modes; do
    start_server
    "$bench" replay --url "$url" --input "$out/warm.jsonl" --out "$out/warm.out" --concurrency "$c" 2> /dev/null
    "$bench" replay --url "$url" --input "$out/$mode.jsonl" --out "$out/$mode.c$c.out" --concurrency "$c" 2> "$out/$mode.c$c.err"
    stop_server
    python3 - "$out/$mode.c$c.out" "$c" "$mode" >> "$table" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ok = [r for r in rows if "error" not in r]
if not ok: sys.exit(f"segment_reuse_live: every request of {sys.argv[1]} failed: {rows[0].get('error') if rows else 'none sent'}")
t = sorted(r["ttft_ms"] - r["sent_ms"] for r in ok)  # each request's own TTFT
pct = lambda q: t[min(len(t) - 1, int(q * len(t)))]
print(f"| {sys.argv[2]} | {sys.argv[3]} | {len(ok)} | {sum(t) / len(t):.0f} | {pct(0.5):.0f} | {pct(0.9):.0f} | "
      f"{sum(r.get('segment_reused_tokens', 0) for r in ok)} | {sum(r['cached_tokens'] for r in ok)} | {sum(r['prompt_tokens'] for r in ok)} |")
PY
  done
done
cat "$table"
if [ "${APPEND:-1}" = 1 ]; then
  {
    echo
    echo "### Segment reuse live, TTFT ($(date -u +%Y-%m-%d), $(nproc) cores: $(lscpu | sed -n 's/^Model name: *//p'))"
    echo
    echo "Command: \`WORKFLOWS=$workflows SCALE=$scale WINDOW=$window MAX_TOKENS=$max_tokens WORKLOAD=$workload MODES=\"$modes\" bench/segment_reuse_live.sh --device $device\`"
    echo
    cat "$table"
  } >> "$root/bench/RESULTS.md"
fi
