#!/usr/bin/env bash
# The Anthropic Messages API (issue 32, item 1) against a real cluster (1 + 1x1 ranks, the default
# model, API keys): the official anthropic SDK's messages.create, messages.stream, tools with a
# tool_result round trip, cache_control usage, count_tokens, x-api-key / Bearer auth and the 4xx
# paths in Anthropic's error shape (tests/integration/anthropic_client_test.py).
#   tests/integration/test_anthropic_client.sh BRAID_BINARY MODEL
# The python with anthropic: $BRAID_TEST_PYTHON, else .venv-test/bin/python.
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${BRAID_TEST_PYTHON:-$root/.venv-test/bin/python}
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

if ! [ -x "$python" ] || ! "$python" -c 'import anthropic, httpx' 2> /dev/null; then
  fail "the anthropic SDK is not installed for $python (scripts/test.sh sets it up)"
  exit 1
fi
key="sk-anthropic-test-$(python3 -c 'import secrets; print(secrets.token_hex(8))')"
key2="sk-anthropic-beta-$(python3 -c 'import secrets; print(secrets.token_hex(8))')"
printf '%s tenant=acme\n%s tenant=beta\n' "$key" "$key2" > "$work/keys"
start_cluster anthropic --instances 1 --kv-blocks 512 --pin-budget 1024 --api-keys "$work/keys" || exit 1
served=$(curl -s -H "x-api-key: $key" "$url/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
check "anthropic SDK suite" "$python" "$root/tests/integration/anthropic_client_test.py" "$url" "$served" "$key" "$key2"
stop_cluster anthropic
echo "$failures failed"
[ "$failures" = 0 ]
