#!/usr/bin/env bash
# Leyline manifests, warm start and pool-occupancy telemetry (issue 18) with the real model, real
# mpirun ranks and real HTTP.
#   tests/integration/test_manifest.sh BRAID_BINARY MODEL
# 1. Recording (a cluster with API keys for two tenants, --manifest-out, --occupancy-log): a probe
#    prompt on the cold server gets cached_tokens 0; GET /v1/cache/manifest?min_count=2 lists the
#    chunks the tenant's prompts repeat, most counted first, and each key sees only its own
#    tenant's lines (tenant= naming another is a 403, no key a 401, min_count=0 a 400);
#    `braid manifest export --url --api-key` writes the same lines; --manifest-out holds every
#    chunk, one valid line each, while the server runs; the occupancy log has device samples with
#    free + cached + in_use == total and blocks in use at some point.
# 2. Offline: `braid batch --trace-out --trace-tokens` over the same prompts, then `braid manifest
#    export --trace`, gives the same chunk hashes as the server (the offline seed is the server's).
# 3. Warm start: a new cluster with --warm-start on the exported manifest plus a malformed and a
#    stale line starts, summarises both skipped lines by reason, logs its progress, and the probe's first request
#    there gets cached_tokens > 0.
# Usage: test_manifest.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

key_acme=sk-acme-manifest-4f1c9a27d3b8
key_globex=sk-globex-manifest-7e2d0b94c1
printf '%s tenant=acme\n%s tenant=globex\n' "$key_acme" "$key_globex" > "$work/keys"

# Chat requests sharing a long system prompt (acme) and one of another tenant (globex); the probe
# shares the system prompt and asks something new.
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
system = ("You are the support assistant of a hardware shop. Policies: refunds within 30 days with a receipt; "
          "store credit after that; no refunds on opened software; warranty claims go to the manufacturer. "
          "Opening hours: weekdays 9 to 18, Saturday 10 to 14, closed on Sunday. Delivery: free above 50 euros, "
          "otherwise 4.90; express next-day delivery costs 12 euros when ordered before 15:00. Always answer briefly.")
questions = ["Can I return a drill after 40 days?", "When are you open on Saturday?", "How much is express delivery?"]
def chat(q, max_tokens=4):
    return {"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "max_tokens": max_tokens, "temperature": 0}
for i, q in enumerate(questions):
    json.dump(chat(q), open(f"{work}/acme{i}.json", "w"))
json.dump(chat("Do you sell garden hoses?"), open(f"{work}/probe.json", "w"))
json.dump({"messages": [{"role": "user", "content": "Globex internal: the launch code word is heliotrope."}],
           "max_tokens": 2}, open(f"{work}/globex.json", "w"))
with open(f"{work}/batch.jsonl", "w") as f:
    for i, q in enumerate(questions):
        line = chat(q)
        f.write(json.dumps(dict(line, id=f"a{i}", tenant="acme")) + "\n")
PY

post() {  # post KEY BODY_FILE [CURL ARGS...] -> response on stdout
  local key=$1 body=$2; shift 2
  curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' ${key:+-H "Authorization: Bearer $key"} -d @"$body" "$@"
}
cached() { python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"])'; }
status_of() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
lines() { grep -c . "$1"; }
# every line a manifest line: the keys, 16-hex hashes, counts never rising; prints the tenants seen
manifest_ok() {
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert rows, "empty manifest"
for r in rows:
    assert set(r) >= {"content_hash", "chunk_tokens", "count", "tenant", "position", "prev_hash"}, r
    assert len(r["content_hash"]) == 16 and int(r["content_hash"], 16) >= 0
    assert (r["prev_hash"] == "") == (r["position"] == 0), r
    assert r["chunk_tokens"] and all(isinstance(t, int) for t in r["chunk_tokens"])
assert all(a["count"] >= b["count"] for a, b in zip(rows, rows[1:])), "not count-descending"
print(" ".join(sorted({r["tenant"] for r in rows})))
PY
}
hashes() { python3 -c 'import json,sys; print("\n".join(sorted(json.loads(l)["content_hash"] for l in open(sys.argv[1]) if l.strip())))' "$1"; }

# ---------------------------------------------------------------- 1. recording
start_cluster rec --instances 1 --kv-blocks 256 --api-keys "$work/keys" --manifest-out "$work/live.jsonl" \
  --occupancy-log "$work/occ.jsonl" --occupancy-interval 0.1 || exit 1
cold=$(post "$key_acme" "$work/probe.json" | cached)
check "cold server: the probe gets cached_tokens 0 (got $cold)" [ "$cold" = 0 ]
for i in 0 1 2; do post "$key_acme" "$work/acme$i.json" > /dev/null; done
post "$key_globex" "$work/globex.json" > /dev/null
curl -s "$url/v1/cache/manifest?min_count=2" -H "Authorization: Bearer $key_acme" > "$work/acme_m.jsonl"
check "acme's manifest (min_count 2): valid lines, count-descending, only acme's" [ "$(manifest_ok "$work/acme_m.jsonl")" = acme ]
check "acme's manifest repeats the system prompt (count 4)" grep -q '"count":4' "$work/acme_m.jsonl"
curl -s "$url/v1/cache/manifest" -H "Authorization: Bearer $key_globex" > "$work/globex_m.jsonl"
check "globex's key sees only globex's lines" [ "$(manifest_ok "$work/globex_m.jsonl")" = globex ]
check "tenant=globex with acme's key is a 403" [ "$(status_of "$url/v1/cache/manifest?tenant=globex" -H "Authorization: Bearer $key_acme")" = 403 ]
check "no key is a 401" [ "$(status_of "$url/v1/cache/manifest")" = 401 ]
check "min_count=0 is a 400" [ "$(status_of "$url/v1/cache/manifest?min_count=0" -H "Authorization: Bearer $key_acme")" = 400 ]
check "tenant=%FF (invalid UTF-8) is a 400, not an empty manifest" \
  [ "$(status_of "$url/v1/cache/manifest?tenant=%FF" -H "Authorization: Bearer $key_acme")" = 400 ]
"$braid" manifest export --url "$url/v1" --api-key "$key_acme" --min-count 2 --out "$work/m.jsonl" 2> "$work/export.err"
check "braid manifest export --url writes the endpoint's lines" cmp -s "$work/m.jsonl" "$work/acme_m.jsonl"
"$braid" manifest export --url "$url" --api-key "$key_acme" --out "$work/all.jsonl" 2> /dev/null
check "without --min-count every acme chunk is exported (the questions' too)" [ "$(lines "$work/all.jsonl")" -gt "$(lines "$work/m.jsonl")" ]
check "--manifest-out: every chunk already on disk while serving, valid lines" \
  [ "$(manifest_ok "$work/live.jsonl")" = "acme globex" -a "$(lines "$work/live.jsonl")" -ge "$(lines "$work/m.jsonl")" ]
stop_cluster rec
check "occupancy log: device samples, free + cached + in_use == total, blocks used at some point" python3 - "$work/occ.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
dev = [r for r in rows if r["tier"] == "device"]
assert len(dev) >= 2, rows
for r in rows:
    assert r["free"] + r["cached"] + r["in_use"] == r["total"] and r["total"] > 0 and r["instance"] == 0, r
    assert min(r["free"], r["cached"], r["in_use"]) >= 0, r
assert any(r["in_use"] > 0 for r in dev) and dev[-1]["cached"] > 0 and dev[-1]["in_use"] == 0, dev
assert all(a["t"] <= b["t"] for a, b in zip(rows, rows[1:]))
PY
if command -v gnuplot > /dev/null; then
  bench_bin=$(dirname "$braid")/braid-bench
  "$bench_bin" plot --occupancy "$work/occ.jsonl" --out "$work/occ.png" 2> "$work/plot.err"
  check "braid-bench plot --occupancy draws the log" [ -s "$work/occ.png" ]
else
  echo "skip braid-bench plot --occupancy (no gnuplot)"
fi

# ---------------------------------------------------------------- 2. offline, from a trace with token ids
"$braid" batch --model "$model" --input "$work/batch.jsonl" --output /dev/null --trace-out "$work/t.trace" --trace-tokens \
  --threads 2 2> "$work/batch.err" > /dev/null || fail "batch exited $?"
"$braid" manifest export --trace "$work/t.trace" --model "$model" --min-count 2 --out "$work/offline.jsonl" 2> "$work/offline.err"
check "offline export from a trace: valid lines" [ "$(manifest_ok "$work/offline.jsonl")" = acme ]
hashes "$work/offline.jsonl" > "$work/offline.h"
hashes "$work/m.jsonl" > "$work/m.h"
check "offline chunks are the server's (same hashes, all in the server's export)" bash -c "[ -s '$work/offline.h' ] && comm -23 '$work/offline.h' '$work/m.h' | wc -l | grep -qx 0"
"$braid" manifest export --trace "$work/t.trace" --out /dev/null --url "$url" 2> "$work/both.err"
check "--url and --trace together are refused (exit 2)" [ $? = 2 ]
check "braid manifest --help shows the usage and exits 0" bash -c "'$braid' manifest --help | grep -q 'braid manifest export --url'"

# ---------------------------------------------------------------- 3. warm start
cp "$work/all.jsonl" "$work/warm.jsonl"
echo '{"content_hash": "00000000000000ff", "chunk_tokens": [1, 2,' >> "$work/warm.jsonl"
# the first line again with one token changed: its content_hash no longer matches (stale)
python3 -c 'import json,sys; r=json.loads(open(sys.argv[1]).readline()); r["chunk_tokens"][0]+=1; r["position"]=0; r["prev_hash"]=""; print(json.dumps(r))' \
  "$work/m.jsonl" >> "$work/warm.jsonl"
# started by hand to record what /health says until it is ready
port=$(free_port)
url=http://127.0.0.1:$port
BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --instances 1 --kv-blocks 256 \
  --warm-start "$work/warm.jsonl" > "$work/warm.out" 2> "$work/warm.err" &
launcher_pid=$!
for _ in $(seq 1 1200); do
  curl -s "$url/health" >> "$work/health.log" && echo >> "$work/health.log"
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && break
  kill -0 "$launcher_pid" 2> /dev/null || break
  sleep 0.1
done
check "warm: ready after its warm start" wait_ready
check "warm start: the malformed line is skipped with its reason" grep -q "1 invalid (first: line $(($(lines "$work/all.jsonl") + 1)), not JSON" "$work/warm.err"
check "warm start: the stale line is skipped with its reason" grep -q "1 stale (first: line $(($(lines "$work/all.jsonl") + 2)), stale" "$work/warm.err"
check "/health said warming (503) before ready" grep -q '"status":"warming"' "$work/health.log"
check "warm start: progress and the summary are logged" grep -qE "warm start: [1-9][0-9]*/[1-9][0-9]* heads, 2 skipped" "$work/warm.err"
check "warm start: every head of the manifest warmed" grep -qE "warm start done .*: ([0-9]+) heads warmed .* 0 refused" "$work/warm.err"
check "warm start: the summary counts the skipped lines" grep -qE "warm start done .* 2 skipped" "$work/warm.err"
python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); b["tenant"]="acme"; json.dump(b, open(sys.argv[1], "w"))' "$work/probe.json"
warm=$(post "" "$work/probe.json" | cached)
check "warm server: the probe's first request gets cached_tokens > 0 (got $warm)" [ "${warm:-0}" -gt 0 ]
stop_cluster warm

echo "manifest: $failures failure(s)"
[ "$failures" = 0 ]
