#!/usr/bin/env bash
# The stateful request-lifecycle fuzzer (issue 37) against a real cluster (1 instance, two tenants
# with API keys and an admin key, a small pool so that directives and eviction interact; explicit caches,
# unpin and runtime adapters in the mix): random request sequences
# for $BRAID_FUZZ_S seconds (default 45; run it for an hour with BRAID_FUZZ_S=3600), every request
# answered within the bound, the in-flight gauge back to 0, and the cluster still drains and exits 0.
# Usage: test_request_fuzz.sh BRAID_BINARY MODEL_PATH [SEED]
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
seed=${3:-$((RANDOM % 10000))}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

key_a=sk-acme-fuzz-6b2e9d1c4a7f
key_b=sk-globex-fuzz-3f8a0c5e7d2b
key_ops=sk-ops-fuzz-9c1d7e3b5a20
printf '%s tenant=acme shares=public\n%s tenant=globex max_concurrent=3\n%s tenant=ops admin adapters=*\n' \
  "$key_a" "$key_b" "$key_ops" > "$work/keys"
# --cache-create-rate 0: the fuzzer's /v1/caches creations are not held back by the rate limit (its 429s are tested elsewhere)
start_cluster fuzz --instances 1 --kv-blocks 96 --api-keys "$work/keys" --max-pending 16 --request-watchdog-s 60 \
  --cache-create-rate 0 --lora-cache separate || exit 1
check "the fuzzer found no hung, dropped or malformed answer (seed $seed)" \
  python3 "$root/tests/integration/fuzz_request_lifecycle.py" "$url" "$key_a,$key_b" --duration "${BRAID_FUZZ_S:-45}" \
  --threads 4 --seed "$seed" --bound 120 --admin-key "$key_ops" --adapter "$root/adapters/coder.gguf"
check "/health answers 200 after the fuzzing" bash -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' '$url/health')\" = 200 ]"
stop_cluster fuzz
echo "request fuzz: $failures failure(s)"
[ "$failures" = 0 ]
