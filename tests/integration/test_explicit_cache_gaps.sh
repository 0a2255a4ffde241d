#!/usr/bin/env bash
# Integration test of issue 32's explicit-cache gaps over real HTTP against a real cluster:
#  - DELETE /v1/caches/{id} ends the cache's pin on the instance: the answer carries the unpin's
#    outcome (accepted, with the tokens unpinned) and braid_kv_pinned_blocks falls back to what it
#    was before the cache; the unpinned blocks are evictable again;
#  - PATCH to a shorter TTL shortens the pin (a pin alone only ever extends its deadline): after the
#    new TTL has passed the pinned blocks are gone from the gauge;
#  - the per-tenant prefill rate (--cache-create-rate): a burst of 16 creations / renewals, then a
#    429 cache_rate_limited with a Retry-After header; another tenant is unaffected;
#  - --state-dir: the registry survives a restart of the whole server (a deleted cache stays
#    deleted, a live one is listed and serves a request naming it).
#   tests/integration/test_explicit_cache_gaps.sh BRAID_BINARY MODEL
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"
json_get() {  # json_get FILE EXPR: evaluates EXPR with d = the file's JSON
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2> /dev/null
}
call() {  # call NAME METHOD PATH [BODY [HEADER]]: writes $work/NAME.json (+ .h headers), prints the status
  local args=(-s -D "$work/$1.h" -o "$work/$1.json" -w '%{http_code}' -X "$2" "$url$3" -H 'Content-Type: application/json')
  [ $# -ge 4 ] && [ -n "$4" ] && args+=(-d "$4")
  [ $# -ge 5 ] && args+=(-H "$5")
  curl "${args[@]}"
}
pinned() { curl -s "$url/metrics" | awk '$1 == "braid_kv_pinned_blocks" {print $2}'; }
pinned_is() { [ "$(pinned)" = "$1" ]; }
pinned_above() { [ "$(pinned)" -gt "$1" ] 2> /dev/null; }
doc=$(python3 -c 'print(" ".join("Clause %d: the supplier ships part %d to depot %d within %d days." % (i, i * 7, i % 5, i + 2) for i in range(1, 30)))')

# The rate is so low that no token refills while the test runs (one per 1000 s), however loaded the machine.
mkdir -p "$work/state"
start_cluster gaps --instances 1 --kv-blocks 256 --device cpu --cache-create-rate 0.001 --state-dir "$work/state" || exit 1
base=$(pinned)
check "the pinned gauge reads ($base)" [ -n "$base" ]

# ---------------------------------------------------------------- DELETE unpins
code=$(call a POST /v1/caches '{"prompt": "'"$doc"'", "ttl": "1h"}')
cid=$(json_get "$work/a.json" 'd["id"]')
check "create cache A: 200 ($cid)" [ "$code" = 200 -a -n "$cid" ]
check "... its pin was accepted" [ "$(json_get "$work/a.json" 'd["pin"]["outcome"]')" = accepted ]
check "the pinned gauge rises" wait_for 10 pinned_above "$base"
code=$(call del DELETE "/v1/caches/$cid")
check "DELETE A: 200 (got $code)" [ "$code" = 200 ] && grep -q '"deleted":true' "$work/del.json"
check "... it reports the unpin accepted ($(head -c 300 "$work/del.json"))" [ "$(json_get "$work/del.json" 'd["unpin"]["outcome"]')" = accepted ]
check "... with the tokens it unpinned" [ "$(json_get "$work/del.json" 'd["unpin"]["tokens"]')" -gt 100 ] 2> /dev/null
check "the pinned gauge is back to $base" wait_for 10 pinned_is "$base"
code=$(call use POST /v1/completions '{"cache_id": "'"$cid"'", "prompt": " Q", "max_tokens": 1}')
check "a request naming the deleted cache: 404 saying so (got $code)" [ "$code" = 404 ] && grep -q "deleted" "$work/use.json"

# ---------------------------------------------------------------- PATCH shortens the pin
code=$(call b POST /v1/caches '{"prompt": "Second document. '"$doc"'", "ttl": "1h"}')
bid=$(json_get "$work/b.json" 'd["id"]')
check "create cache B (1 h): 200" [ "$code" = 200 -a -n "$bid" ]
check "the pinned gauge rises again" wait_for 10 pinned_above "$base"
code=$(call patch PATCH "/v1/caches/$bid" '{"ttl": 2}')
check "PATCH B to 2 s: 200 (got $code)" [ "$code" = 200 ]
check "... the renewed pin says 2 s ($(head -c 400 "$work/patch.json"))" [ "$(json_get "$work/patch.json" 'd["pin"]["ttl_s"]')" = 2 ]
sleep 3
# A step of the instance expires pins; a request makes sure one runs.
call tick POST /v1/completions '{"prompt": "tick", "max_tokens": 1}' > /dev/null
check "after 3 s the shortened pin is gone from the gauge" wait_for 10 pinned_is "$base"

# ---------------------------------------------------------------- the prefill rate
code=$(call r0 POST /v1/caches '{"prompt": "Rate document.", "ttl": 60}' "X-Braid-Tenant: ratey")
rid=$(json_get "$work/r0.json" 'd["id"]')
check "tenant ratey creates a cache: 200" [ "$code" = 200 -a -n "$rid" ]
ok_patches=0
for i in $(seq 1 15); do
  [ "$(call "r$i" PATCH "/v1/caches/$rid" '{"ttl": 60}' "X-Braid-Tenant: ratey")" = 200 ] && ok_patches=$((ok_patches + 1))
done
check "15 renewals after it go through (burst of 16: got $ok_patches)" [ "$ok_patches" = 15 ]
code=$(call r16 PATCH "/v1/caches/$rid" '{"ttl": 60}' "X-Braid-Tenant: ratey")
check "the 17th prefill of the tenant: 429 (got $code)" [ "$code" = 429 ]
check "... code cache_rate_limited" [ "$(json_get "$work/r16.json" 'd["error"]["code"]')" = cache_rate_limited ]
retry=$(awk 'tolower($1) == "retry-after:" {print $2}' "$work/r16.h" | tr -d '\r')
check "... with a Retry-After of at least 1 s (got '$retry')" [ "$retry" -ge 1 ] 2> /dev/null
code=$(call r17 POST /v1/caches '{"prompt": "Rate document two.", "ttl": 60}' "X-Braid-Tenant: ratey")
check "a creation by that tenant now: 429 too (got $code)" [ "$code" = 429 ]
code=$(call other POST /v1/caches '{"prompt": "Another tenant.", "ttl": 60}' "X-Braid-Tenant: calm")
check "another tenant is unaffected: 200 (got $code)" [ "$code" = 200 ]
oid=$(json_get "$work/other.json" 'd["id"]')
check "the state file exists" [ -s "$work/state/explicit_caches.json" ]
stop_cluster gaps

# ---------------------------------------------------------------- --state-dir: a server restart
start_cluster again --instances 1 --kv-blocks 256 --device cpu --state-dir "$work/state" || exit 1
check "the log says the caches were restored" grep -q "cache(s) restored" "$work/again.err"
code=$(call get_other GET "/v1/caches/$oid" "" "X-Braid-Tenant: calm")
check "tenant calm's cache is there after the restart: 200 (got $code)" [ "$code" = 200 ] && [ "$(json_get "$work/get_other.json" 'd["id"]')" = "$oid" ]
code=$(call use_other POST /v1/completions '{"cache_id": "'"$oid"'", "prompt": " And?", "max_tokens": 2}' "X-Braid-Tenant: calm")
check "a request naming it: 200 (got $code)" [ "$code" = 200 ]
code=$(call list_ratey GET /v1/caches "" "X-Braid-Tenant: ratey")
check "tenant ratey's cache is listed" [ "$code" = 200 ] && [ "$(json_get "$work/list_ratey.json" 'len(d["data"])')" = 1 ]
code=$(call get_a GET "/v1/caches/$cid")
check "the cache deleted before the restart stays gone: 404 (got $code)" [ "$code" = 404 ]
code=$(call get_other_wrong GET "/v1/caches/$oid" "" "X-Braid-Tenant: ratey")
check "another tenant still cannot see it: 404 (got $code)" [ "$code" = 404 ]
stop_cluster again

echo "$failures failed"
[ "$failures" = 0 ]
