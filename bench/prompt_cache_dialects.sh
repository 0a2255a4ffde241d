#!/usr/bin/env bash
# The same prompt-caching workload through each dialect (issue 32): OpenAI plain, OpenAI with
# prompt_cache_key, an explicit cache (POST /v1/caches + cache_id) and, when the server has
# /v1/messages, Anthropic cache_control — hit rate and TTFT side by side, from one run on one
# two-instance server (each dialect in a tenant of its own, so each starts cold).
# bench/prompt_cache_dialects.py says what the workload is.
# Usage: bench/prompt_cache_dialects.sh [OUT_DIR]
#   env: INSTANCES=2 USERS=6 BURST=4 GAP=0.05 DOC_WORDS=260 SEED=7, DIALECTS (a subset), BRAID_BIN, BRAID_MODEL,
#        ROUTER (--router; default: the server's)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/prompt_cache_dialects}
mkdir -p "$out"
# shellcheck source=serve_lib.sh
source "$root/bench/serve_lib.sh"
router_args=()
[ -n "${ROUTER:-}" ] && router_args=(--router "$ROUTER")
serve dialects --instances "${INSTANCES:-2}" --kv-blocks 1024 --events "$out/events.jsonl" "${router_args[@]}"
{
  echo "# prompt cache dialects — $(date -u +%F) on $(nproc) cores, $(basename "$model"), ${INSTANCES:-2} instances, router ${ROUTER:-default}"
  python3 "$root/bench/prompt_cache_dialects.py" "$url"
  echo "routing reasons: $(python3 -c 'import collections, json, sys; print(dict(collections.Counter(json.loads(l).get("reason") for l in open(sys.argv[1]) if "\"route\"" in l)))' "$out/events.jsonl")"
} | tee "$out/results.md"
stop
