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
# shellcheck source=serve_lib.sh
source "$root/bench/serve_lib.sh"

"$bench" gen --workload cross-tenant --workflows "$workflows" --concurrency "$conc" --scale "$scale" --model "$model" \
  --out "$out/ct.trace" --batch-out "$out/ct.batch.jsonl" 2> "$out/gen.err"
python3 "$root/bench/directives_transform.py" cross-tenant "$out/ct.batch.jsonl" "$out/ct" "$max_tokens"

arm() {  # arm NAME INPUT SERVE_ARGS...
  local name=$1 input=$2; shift 2
  echo "[tenants] $name" >&2
  serve "$name" --kv-blocks "$kv_blocks" "$@"
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
