#!/usr/bin/env bash
# Cross-tenant sharing, live (issue 18; Leyline § 5 and App. S): the cross-tenant workload (four
# tenants reading shared articles) replayed over HTTP against `braid serve`, CONCURRENCY at a time,
# greedy, in four arms, each on a fresh server:
#   off         sharing off: each tenant's cache is its own (cross-tenant copies must be 0: asserted);
#   share       every request shares its prompt through the article with all tenants (opt-in);
#   warm        sharing off, the server warm-started from the manifest the `off` server exported
#               (`braid manifest export --url`): each tenant's hot heads are prefilled before traffic;
#   warm+share  both.
# Reported: hit rate ((cached + reused) / prompt tokens), tokens copied across tenants
# (braid_kv_shared_hit_tokens_total), run seconds.
# Usage: bench/directives_tenants.sh [OUT_DIR]   (env: WORKFLOWS=24 SCALE=0.5 MAX_TOKENS=16 CONCURRENCY=4 KV_BLOCKS=1024)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BRAID_BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/directives_tenants}
workflows=${WORKFLOWS:-24}
scale=${SCALE:-0.5}
max_tokens=${MAX_TOKENS:-16}
conc=${CONCURRENCY:-4}
kv_blocks=${KV_BLOCKS:-1024}
mkdir -p "$out"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
pid=""
# The launcher runs in its own session (setsid): on any exit, everything in it goes.
trap '[ -n "$pid" ] && kill -KILL -- -"$pid" 2> /dev/null || true' EXIT

serve() {  # serve NAME ARGS...
  local name=$1; shift
  BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --instances 1 --kv-blocks "$kv_blocks" "$@" \
    > "$out/$name.out" 2> "$out/$name.err" &
  pid=$!
  for _ in $(seq 1 1200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && return 0
    sleep 0.5
  done
  echo "server $name did not get ready" >&2; exit 1
}
stop() { kill -TERM "$pid"; wait "$pid" || true; pid=""; }
metric() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n {print $2}'; }

"$bench" gen --workload cross-tenant --workflows "$workflows" --concurrency "$conc" --scale "$scale" --model "$model" \
  --out "$out/ct.trace" --batch-out "$out/ct.batch.jsonl" 2> "$out/gen.err"
python3 "$root/bench/directives_transform.py" cross-tenant "$out/ct.batch.jsonl" "$out/ct" "$max_tokens"

arm() {  # arm NAME INPUT SERVE_ARGS...
  local name=$1 input=$2; shift 2
  echo "[tenants] $name" >&2
  serve "$name" "$@"
  local t0=$SECONDS
  python3 "$root/bench/replay_batch_http.py" "$url" "$input" "$out/$name.results.jsonl" "$conc"
  echo "$((SECONDS - t0))" > "$out/$name.secs"
  sleep 2.5
  metric braid_kv_shared_hit_tokens_total > "$out/$name.shared"
  if [ "$name" = off ]; then "$braid" manifest export --url "$url" --min-count 2 --out "$out/manifest.jsonl" 2> "$out/export.err"; fi
  stop
}

arm off "$out/ct.in-plain.jsonl"
arm share "$out/ct.in-share.jsonl"
arm warm "$out/ct.in-plain.jsonl" --warm-start "$out/manifest.jsonl"
arm warm+share "$out/ct.in-share.jsonl" --warm-start "$out/manifest.jsonl"

python3 - "$out" <<'PY' | tee "$out/table.md"
import json, sys
out = sys.argv[1]
print(f"manifest: {sum(1 for _ in open(f'{out}/manifest.jsonl'))} chunks (min count 2)\n")
print("| arm | hit rate | tokens copied across tenants | requests | run s |")
print("|---|---:|---:|---:|---:|")
for arm in ["off", "share", "warm", "warm+share"]:
    rs = [json.loads(l) for l in open(f"{out}/{arm}.results.jsonl")]
    prompt = sum(r["prompt_tokens"] for r in rs)
    hit = 100.0 * sum(r["cached_tokens"] + r["segment_reused_tokens"] for r in rs) / prompt
    shared = int(float(open(f"{out}/{arm}.shared").read().strip() or 0))
    if arm in ("off", "warm") and shared != 0:
        sys.exit(f"{arm}: {shared} tokens copied across tenants with sharing off")
    print(f"| {arm} | {hit:.1f}% | {shared} | {len(rs)} | {open(f'{out}/{arm}.secs').read().strip()} |")
PY
