#!/usr/bin/env bash
# Every request the server accepts ends with an HTTP answer within a bound; hostile requests found
# the holes (issue 37). Against a real cluster (1 instance, API keys for two tenants):
#  1. a splice that leaves an empty prompt (span, match, mode forget) is a 400 JSON, never a hang,
#     and the in-flight gauge returns to 0;
#  2. the progress watchdog: with the instance's leader stopped (SIGSTOP, alive for its silence
#     timeout), a request gets a JSON 500 within --request-watchdog-s plus slack, the coordinator
#     logs its id, /metrics counts it, /health reports it; once the leader runs again the server
#     serves and the gauge is 0;
#  3. workflow ids in the URL path: %FF (invalid UTF-8), a%0D%0Ab (control characters) and an
#     over-long id are 400 JSON; ids are per tenant: another tenant's key does not end a workflow
#     (braid_workflows_active stays), X-Braid-Tenant naming a tenant the key does not share is a
#     403, the owner's key ends it;
#  4. per-key limits (key file max_concurrent= / rate=): a key past its own limit gets 429 with
#     Retry-After while another key of the same tenant is served;
#  5. SIGTERM to the launcher stops accepting at once: a connection 0.05 s and 0.1 s later is
#     refused (before, it was accepted and answered 503), while a request in flight when the signal
#     came is still answered 200; the launcher drains and exits 0.
# Usage: test_request_bounds.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"
# shellcheck source=rank_pid.sh
source "$root/tests/integration/rank_pid.sh"

key_a=sk-acme-bounds-5a7c1e9f3d2b
key_b=sk-globex-bounds-8d3f0a6c4e1
key_one=sk-acme-one-at-a-time-3e8b2d
key_slow=sk-acme-slow-rate-9c4a7f1e
printf '%s tenant=acme\n%s tenant=globex\n%s tenant=acme max_concurrent=1\n%s tenant=acme rate=0.2\n' \
  "$key_a" "$key_b" "$key_one" "$key_slow" > "$work/keys"
leader_pid=""
cleanup_leader() { [ -n "$leader_pid" ] && kill -CONT "$leader_pid" 2> /dev/null; }
trap 'cleanup_leader; cleanup' EXIT

start_cluster bounds --instances 1 --kv-blocks 256 --api-keys "$work/keys" --request-watchdog-s 10 --instance-timeout 120 || exit 1

# post PATH KEY BODY [CURL ARGS...] -> the status (curl gives up after 30 s: a hang shows as 000);
# the body is in $work/resp
post() {
  local path=$1 key=$2 body=$3; shift 3
  rm -f "$work/resp"
  curl -s --max-time 30 -o "$work/resp" -w '%{http_code}' "$url$path" -H 'Content-Type: application/json' \
    -H "Authorization: Bearer $key" -d "$body" "$@"
}
# resp_ok PY_EXPR: the expression holds of the last response's JSON (d)
resp_ok() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert $1, d" "$work/resp" 2> /dev/null; }
metric_k() { curl -s "$url/metrics" -H "Authorization: Bearer $key_a" | awk -v n="$1" '$1 == n {print $2}'; }
inflight_zero() { [ "$(metric_k braid_requests_inflight)" = 0 ]; }

# ---------------------------------------------------------------- 1. splices that empty the prompt
for body in '{"prompt":[1000,1001,1002],"max_tokens":2,"directives":[{"op":"splice","span":[0,3],"replacement":""}]}' \
  '{"prompt":"Hello there friend","max_tokens":2,"directives":[{"op":"splice","span":{"match":"Hello there friend"},"replacement":""}]}' \
  '{"prompt":[1000,1001,1002],"max_tokens":2,"directives":[{"op":"splice","span":[0,3],"replacement":"","mode":"forget"}]}'; do
  r=$(post /v1/completions "$key_a" "$body")
  check "empty splice answered 400 JSON, not a hang (${body:60:60}...): got $r" [ "$r" = 400 ]
  check "... naming the directives" resp_ok 'd["error"]["param"] == "directives" and "empty" in d["error"]["message"]'
done
check "after the empty splices the in-flight gauge is 0" wait_for 5 inflight_zero
r=$(post /v1/completions "$key_a" '{"prompt":[1000,1001,1002,1003],"max_tokens":2,"directives":[{"op":"splice","span":[0,3],"replacement":""}]}')
check "a splice that leaves one token is served (200, got $r)" [ "$r" = 200 ]

# ---------------------------------------------------------------- 2. the progress watchdog
leader_pid=$(rank_pid 1)
check "found the leader's pid" [ -n "$leader_pid" ]
kill -STOP "$leader_pid"
t0=$(date +%s.%N)
r=$(post /v1/completions "$key_a" '{"prompt":"The watchdog test","max_tokens":4}' --max-time 60)
took=$(python3 -c "import sys; print(round($(date +%s.%N) - $t0, 1))")
check "a request the stopped instance cannot serve gets a 500 within the watchdog (got $r after $took s)" \
  bash -c "[ '$r' = 500 ] && python3 -c 'assert 9.5 < $took < 45'"
check "the 500 is JSON naming the watchdog" resp_ok '"watchdog" in d["error"]["message"]'
check "the coordinator logged the request's id" grep -qE "req [0-9]+: no token and no queue movement on instance 0" "$work/bounds.err"
check "/metrics counts it" [ "$(metric_k braid_requests_watchdog_total)" = 1 ]
check "/health reports it" bash -c "curl -s '$url/health' | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d[\"requests_past_watchdog\"] == 1 and d[\"request_watchdog\"][\"timeout_s\"] == 10, d'"
check "the in-flight gauge is back to 0" wait_for 5 inflight_zero
kill -CONT "$leader_pid"
leader_pid=""
r=$(post /v1/completions "$key_a" '{"prompt":"The watchdog test","max_tokens":4}')
check "once the leader runs again the server serves (200, got $r)" [ "$r" = 200 ]
check "/health is ready again" bash -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' '$url/health')\" = 200 ]"

# ---------------------------------------------------------------- 3. workflow ids in the path
for id in '%FF' 'a%0D%0Ab' 'tab%09x' "$(printf 'w%.0s' $(seq 1 300))"; do
  r=$(post "/v1/workflows/$id/end" "$key_a" '')
  check "workflow id '${id:0:20}' in the path is a 400 (got $r)" [ "$r" = 400 ]
  check "... with a JSON error naming workflow_id" resp_ok 'd["error"]["param"] == "workflow_id"'
done
r=$(post "/v1/workflows/caf%C3%A9/end" "$key_a" '')
check "a valid UTF-8 workflow id is ended (200, got $r)" [ "$r" = 200 ]
r=$(post /v1/completions "$key_a" '{"prompt":"Workflow call","max_tokens":1,"workflow_id":"w1","agent":"planner"}')
check "acme's workflow call served (got $r)" [ "$r" = 200 ]
active() { metric_k braid_workflows_active; }
check "acme's workflow is active" [ "$(active)" = 1 ]
r=$(post /v1/workflows/w1/end "$key_b" '')
check "globex's key ending 'w1' answers 200 (its own namespace; got $r)" [ "$r" = 200 ]
sleep 0.5
check "globex's key did not end acme's workflow (still active: $(active))" [ "$(active)" = 1 ]
r=$(post /v1/workflows/w1/end "$key_b" '' -H 'X-Braid-Tenant: acme')
check "X-Braid-Tenant naming a tenant the key does not share is a 403 (got $r)" [ "$r" = 403 ]
r=$(post /v1/workflows/w1/end "$key_a" '')
ended() { [ "$(active)" = 0 ]; }
check "acme's key ends acme's workflow (got $r)" [ "$r" = 200 ]
check "... and it is no longer active" wait_for 5 ended

# ---------------------------------------------------------------- 4. per-key limits
retry_after() { curl -s -D - -o /dev/null --max-time 30 "$url/v1/completions" -H 'Content-Type: application/json' \
  -H "Authorization: Bearer $1" -d '{"prompt":"limits","max_tokens":1}' | tr -d '\r' | awk -F': ' 'tolower($1) == "retry-after" {print $2}'; }
# (the client's bound is generous: the key's slot is freed when the server ends the request, and a
# client that gave up first would leave it in flight and turn the next check into a false 429)
curl -s --max-time 240 -o /dev/null "$url/v1/completions" -H 'Content-Type: application/json' -H "Authorization: Bearer $key_one" \
  -d '{"prompt":"a long one","max_tokens":300,"ignore_eos":true}' &
long=$!
sleep 0.5
r=$(post /v1/completions "$key_one" '{"prompt":"a second one","max_tokens":1}')
check "max_concurrent=1: a second request while one is in flight is a 429 (got $r)" [ "$r" = 429 ]
check "... naming the key's max_concurrent" resp_ok '"max_concurrent" in d["error"]["message"]'
r=$(post /v1/completions "$key_a" '{"prompt":"another key","max_tokens":1}')
check "another key of the same tenant is served meanwhile (got $r)" [ "$r" = 200 ]
wait "$long"
r=$(post /v1/completions "$key_one" '{"prompt":"after the first","max_tokens":1}')
check "once its request ended the limited key is served again (got $r)" [ "$r" = 200 ]
r=$(post /v1/completions "$key_slow" '{"prompt":"rate one","max_tokens":1}')
check "rate=0.2: the first request is served (got $r)" [ "$r" = 200 ]
ra=$(retry_after "$key_slow")
check "rate=0.2: the next one at once is a 429 with Retry-After 1..5 (got '$ra')" bash -c "[ -n '$ra' ] && [ '$ra' -ge 1 ] && [ '$ra' -le 5 ]"
r=$(post /v1/completions "$key_a" '{"prompt":"unlimited","max_tokens":1}')
check "the unlimited key is never refused (got $r)" [ "$r" = 200 ]

# ---------------------------------------------------------------- 5. SIGTERM stops accepting at once
probe() {  # probe DELAY: "STATUS CURL_EXIT" of a request sent DELAY s after SIGTERM reached the launcher
  sleep "$1"
  curl -s --max-time 240 -o /dev/null -w '%{http_code}' "$url/v1/completions" -H 'Content-Type: application/json' \
    -H "Authorization: Bearer $key_a" -d "{\"prompt\":\"after the signal\",\"max_tokens\":$2,\"ignore_eos\":true}"
  echo " $?"
}
# in flight when the signal comes, and long enough (seconds, even on a fast machine) that the drain
# is still going when the kept-alive connection sends its next request
probe 0 400 > "$work/probe0" &
p0=$!
# a kept-alive connection opened before the signal: its next request gets the drain's 503
python3 - "$url" "$key_a" "$work" > "$work/keepalive" 2>&1 <<'PY' &
import http.client, json, os, sys, time, urllib.parse
url, key, work = sys.argv[1:]
u = urllib.parse.urlparse(url)
conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
body = json.dumps({"prompt": "kept alive", "max_tokens": 1})
headers = {"Content-Type": "application/json", "Authorization": "Bearer " + key}
conn.request("POST", "/v1/completions", body, headers)
r = conn.getresponse(); r.read()
first = r.status
open(work + "/kept", "w").close()
while not os.path.exists(work + "/go"): time.sleep(0.01)
conn.request("POST", "/v1/completions", body, headers)
r = conn.getresponse(); text = r.read()
print(first, r.status, r.getheader("Retry-After"), "error" in json.loads(text))
PY
pk=$!
kept() { [ -e "$work/kept" ]; }
wait_for 60 kept || fail "the kept-alive connection's first request did not finish"
sleep 0.3
probe 0.05 2 > "$work/probe1" &
p1=$!
probe 0.1 2 > "$work/probe2" &
p2=$!
kill -TERM "$launcher_pid"
sleep 0.2
touch "$work/go"
wait "$p0" "$p1" "$p2" "$pk"
check "a connection 0.05 s after SIGTERM is refused (status, curl exit: $(cat "$work/probe1"))" [ "$(cat "$work/probe1")" = "000 7" ]
check "a connection 0.1 s after SIGTERM is refused (status, curl exit: $(cat "$work/probe2"))" [ "$(cat "$work/probe2")" = "000 7" ]
check "the request in flight at the signal is still answered (status, curl exit: $(cat "$work/probe0"))" [ "$(cat "$work/probe0")" = "200 0" ]
check "a request on a connection opened before the signal gets 503 with Retry-After and a JSON error ($(cat "$work/keepalive"))" \
  grep -qE '^200 503 [0-9]+ True$' "$work/keepalive"
wait "$launcher_pid"; status=$?
launcher_pid=""
check "the launcher drained and exited 0 (got $status)" [ "$status" = 0 ]
sleep 0.5
check "no ranks left" cluster_gone

echo "request bounds: $failures failure(s)"
[ "$failures" = 0 ]
