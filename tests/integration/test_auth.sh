#!/usr/bin/env bash
# Integration test of API keys (braid serve --api-keys FILE; issue 22, point 2): real mpirun ranks,
# real HTTP.
#   tests/integration/test_auth.sh BRAID_BINARY MODEL
# 1. A malformed key file stops the server at start-up with a message naming the line, not the key;
#    a non-loopback --host without keys gets a start-up warning.
# 2. 1 + 1x1 ranks with two tenants' keys: /health is open; everything else answers 401 with an
#    OpenAI-style JSON error for a missing or wrong key; a request runs in its key's tenant (its
#    repeated prefix is cached, another tenant's identical prompt gets cached_tokens 0); naming
#    another tenant (body or header) is a 403 unless the key shares it; adapters are limited to the
#    key's list; no key appears in the server's output. With the openai package: the official
#    client authenticates with api_key=KEY and gets AuthenticationError for a wrong one.
#    When openssl is installed, this cluster serves HTTPS (--tls-cert/--tls-key with a self-signed
#    certificate the checks trust) and plain HTTP to its port gets no answer.
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${BRAID_TEST_PYTHON:-$root/.venv-test/bin/python}
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

key_acme=sk-acme-test-4f1c9a27d3b86e05
key_globex=sk-globex-test-7e2d0b94c15fa863
key_ops=sk-ops-test-0a9b8c7d6e5f4a3b

# ---------------------------------------------------------------- start-up checks
printf '# keys\n%s tenant=acme\n%s tenant=globex adapter=x\n' "$key_acme" "$key_globex" > "$work/bad_keys"
port=$(free_port)
BRAID_BIN=$braid timeout 60 "$root/launch/braid-local" --model "$model" --port "$port" --api-keys "$work/bad_keys" \
  > "$work/bad.out" 2> "$work/bad.err"
status=$?
check "a malformed key file stops the server (exit $status)" [ "$status" != 0 -a "$status" != 124 ]
check "the start-up error names the file's line and field" grep -q "api-keys .*bad_keys line 3: unknown field 'adapter'" "$work/bad.err"
check "the start-up error does not quote a key" bash -c "! grep -q -e '$key_acme' -e '$key_globex' '$work/bad.err' '$work/bad.out'"
BRAID_BIN=$braid timeout 60 "$root/launch/braid-local" --model "$work/no-such-model.gguf" --host 0.0.0.0 --port "$port" \
  > "$work/open.out" 2> "$work/open.err"
check "a non-loopback --host without --api-keys warns at start-up" grep -q "warning: --host 0.0.0.0 is reachable from other machines" "$work/open.err"

# ---------------------------------------------------------------- a cluster with keys
cat > "$work/keys" <<EOF
# tenant acme: two adapters, and the shared 'public' namespace
$key_acme tenant=acme adapters=coder,tester shares=public
$key_globex   tenant=globex    # no adapters, nothing shared
$key_ops tenant=ops adapters=*
EOF
port=$(free_port)
scheme=http
tls_args=()
tls_curl=()
if command -v openssl > /dev/null && openssl req -x509 -newkey rsa:2048 -nodes -keyout "$work/tls.key" -out "$work/tls.crt" -days 1 \
     -subj "/CN=127.0.0.1" -addext "subjectAltName=IP:127.0.0.1" 2> /dev/null; then
  scheme=https
  tls_args=(--tls-cert "$work/tls.crt" --tls-key "$work/tls.key")
  tls_curl=(--cacert "$work/tls.crt")
else
  echo "skip TLS (no openssl to make a certificate): the keys cluster serves plain HTTP"
fi
url=$scheme://127.0.0.1:$port
# The adapters the keys name are loaded (an adapter the server does not have is a 404 before any key check).
lora_args=()
for role in planner coder tester summarizer; do lora_args+=(--lora "$role=$root/adapters/$role.gguf"); done
BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --kv-blocks 64 --api-keys "$work/keys" \
  "${lora_args[@]}" "${tls_args[@]+"${tls_args[@]}"}" > "$work/keys.out" 2> "$work/keys.err" &
launcher_pid=$!
ready=0
wait_ready "${tls_curl[@]+"${tls_curl[@]}"}" && ready=1
check "a cluster with API keys becomes ready; /health needs no key" [ "$ready" = 1 ]
[ "$ready" = 1 ] || { cat "$work/keys.err"; exit 1; }
check "start-up says how many keys, not which" grep -q "API keys: 3 from" "$work/keys.err"
if [ "$scheme" = https ]; then
  check "the ready line names the https URL" grep -q "at https://127.0.0.1:$port/v1" "$work/keys.out"
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health")
  check "plain HTTP to the TLS port gets no HTTP answer (got $code)" [ "$code" = 000 ]
fi

# req KEY PATH [CURL ARGS...] -> the status; body in $work/body, headers in $work/headers
req() {
  local key=$1 path=$2; shift 2
  local auth=(); [ -n "$key" ] && auth=(-H "Authorization: Bearer $key")
  curl -s "${tls_curl[@]+"${tls_curl[@]}"}" -D "$work/headers" -o "$work/body" -w '%{http_code}' "$url$path" \
    "${auth[@]+"${auth[@]}"}" "$@"
}
complete() {  # complete KEY BODY [CURL ARGS...] -> the status
  local key=$1 body=$2; shift 2
  req "$key" /v1/completions -H 'Content-Type: application/json' -d "$body" "$@"
}
error_code() { python3 -c 'import json, sys; e = json.load(open(sys.argv[1]))["error"]; print(e["code"], e["type"])' "$work/body" 2> /dev/null; }
cached() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["usage"]["prompt_tokens_details"]["cached_tokens"])' "$work/body"; }

body='{"prompt": "hi", "max_tokens": 2}'
code=$(complete "" "$body")
check "no key -> 401 missing_api_key with a JSON error (got $code, $(error_code))" \
  [ "$code" = 401 -a "$(error_code)" = "missing_api_key invalid_request_error" ]
check "the 401 says Bearer (WWW-Authenticate)" grep -qi '^www-authenticate: bearer' "$work/headers"
code=$(complete sk-wrong-0000000000000000 "$body")
check "wrong key -> 401 invalid_api_key (got $code, $(error_code))" [ "$code" = 401 -a "$(error_code)" = "invalid_api_key invalid_request_error" ]
code=$(complete "${key_acme}x" "$body")
check "a key with one character more -> 401 (got $code)" [ "$code" = 401 ]
code=$(complete "${key_acme%?}" "$body")
check "a key with one character less -> 401 (got $code)" [ "$code" = 401 ]
code=$(req "" /v1/completions -H 'Content-Type: application/json' -H "Authorization: Basic $key_acme" -d "$body")
check "another scheme than Bearer -> 401 (got $code)" [ "$code" = 401 ]
for path in /v1/models /metrics; do
  code=$(req "" "$path")
  check "GET $path without a key -> 401 (got $code)" bash -c "[ $code = 401 ] && python3 -c 'import json, sys; json.load(open(sys.argv[1]))[\"error\"]' '$work/body'"
  code=$(req "$key_globex" "$path")
  check "GET $path with a key -> 200 (got $code)" [ "$code" = 200 ]
done
code=$(req "" /v1/workflows/wf-1/end -X POST)
check "POST /v1/workflows/{id}/end without a key -> 401 (got $code)" [ "$code" = 401 ]

# The tenant comes from the key: acme's repeated prompt hits its cache; globex's identical prompt
# gets nothing of it (the cross-tenant side channel closed); naming acme is refused to globex.
shared='{"prompt": "A long shared preamble about the history of tea, long enough to fill a couple of KV blocks. Question:", "max_tokens": 2}'
complete "$key_acme" "$shared" > /dev/null
code=$(complete "$key_acme" "$shared")
check "acme's second identical prompt is served from acme's cache (status $code, cached $(cached))" [ "$code" = 200 -a "$(cached)" -ge 16 ]
code=$(complete "$key_globex" "$shared")
check "globex sending acme's prompt gets cached_tokens 0 (status $code, cached $(cached))" [ "$code" = 200 -a "$(cached)" = 0 ]
shared_as_acme='{"prompt": "A long shared preamble about the history of tea, long enough to fill a couple of KV blocks. Question:", "max_tokens": 2, "tenant": "acme"}'
code=$(complete "$key_globex" "$shared_as_acme")
check "globex naming tenant acme in the body -> 403 (got $code, $(error_code))" [ "$code" = 403 -a "$(error_code)" = "tenant_not_allowed invalid_request_error" ]
code=$(complete "$key_globex" "$shared" -H 'X-Braid-Tenant: acme')
check "globex naming tenant acme in X-Braid-Tenant -> 403 (got $code)" [ "$code" = 403 ]
code=$(complete "$key_acme" "$shared_as_acme")
check "acme naming its own tenant is the key's namespace (status $code, cached $(cached))" [ "$code" = 200 -a "$(cached)" -ge 16 ]
code=$(complete "$key_acme" "$shared_as_acme" -H 'X-Braid-Tenant: public')
check "body and header tenants that differ -> 400 (got $code)" [ "$code" = 400 ]
code=$(complete "$key_acme" "$shared" -H 'X-Braid-Tenant: public')
check "acme may use the namespace it shares, which is not its own (status $code, cached $(cached))" [ "$code" = 200 -a "$(cached)" = 0 ]
code=$(complete "$key_globex" "$shared" -H 'X-Braid-Tenant: public')
check "globex does not share public -> 403 (got $code)" [ "$code" = 403 ]

# Adapters: only those the key lists (or any, with adapters=*).
code=$(complete "$key_acme" '{"prompt": "hi", "max_tokens": 2, "adapter": "coder"}')
check "acme may name adapter coder (got $code)" [ "$code" = 200 ]
code=$(complete "$key_acme" '{"prompt": "hi", "max_tokens": 2}' -H 'X-Braid-Adapter: planner')
check "acme may not name adapter planner -> 403 (got $code, $(error_code))" [ "$code" = 403 -a "$(error_code)" = "adapter_not_allowed invalid_request_error" ]
code=$(complete "$key_globex" '{"prompt": "hi", "max_tokens": 2, "adapter": "coder"}')
check "a key without adapters= may name none -> 403 (got $code)" [ "$code" = 403 ]
code=$(complete "$key_ops" '{"prompt": "hi", "max_tokens": 2, "adapter": "summarizer"}')
check "adapters=* allows any adapter (got $code)" [ "$code" = 200 ]

req "$key_ops" /metrics > /dev/null && cp "$work/body" "$work/metrics.txt"
check "401s and 403s are counted in /metrics" \
  bash -c "grep -q 'status=\"401\"' '$work/metrics.txt' && grep -q 'status=\"403\"' '$work/metrics.txt'"

if [ -x "$python" ] && "$python" -c 'import openai' 2> /dev/null; then
  req "$key_acme" /v1/models > /dev/null
  served=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["data"][0]["id"])' "$work/body")
  # httpx (under the openai client) trusts SSL_CERT_FILE, here the test's self-signed certificate.
  py_env=(); [ "$scheme" = https ] && py_env=(SSL_CERT_FILE="$work/tls.crt")
  check "the openai client authenticates with api_key and is refused with a wrong one" env "${py_env[@]+"${py_env[@]}"}" "$python" -c '
import sys, openai
url, model, key = sys.argv[1:4]
r = openai.OpenAI(base_url=url, api_key=key).completions.create(model=model, prompt="hi", max_tokens=2)
assert r.usage.completion_tokens >= 1
try:
    openai.OpenAI(base_url=url, api_key="sk-wrong-0000000000000000").completions.create(model=model, prompt="hi", max_tokens=2)
    sys.exit(1)
except openai.AuthenticationError:
    pass' "$url/v1" "$served" "$key_acme"
else
  echo "skip the openai client check (no openai package for $python)"
fi

kill -TERM "$launcher_pid"
wait "$launcher_pid"; status=$?
launcher_pid=""
check "SIGTERM drains and exits 0 (got $status)" [ "$status" = 0 ]
check "no key appears in the server's output" \
  bash -c "! grep -q -e '$key_acme' -e '$key_globex' -e '$key_ops' '$work/keys.out' '$work/keys.err'"

echo "$failures failed"
[ "$failures" = 0 ]
