#!/usr/bin/env bash
# Prompt caching the way clients already ask for it (issue 32, items 2, 3 and 5), on one live
# two-instance cluster with the real model:
#  - vLLM-named metrics: /metrics parsed with prometheus_client's text parser has every vllm:*
#    family with vLLM's type, one series per instance (engine="0"/"1") labelled model_name, and
#    the counters and histograms moved by the requests this test made;
#  - prompt_cache_key: a keyed request whose prompt overlaps a short head cached on the other
#    instance goes to the key's instance (route event reason "cache_key"); a long overlap elsewhere
#    beats the key; keys are per tenant; bad values are 400s;
#  - prompt_cache_retention: "24h" pins the prompt and reports the pin's outcome under
#    directive_outcomes (source prompt_cache_retention); "in_memory" adds nothing; others are 400s;
#  - explicit caches: POST / GET / PATCH / DELETE /v1/caches over HTTP, chat and completion requests
#    naming cache_id start from the cache (cached tokens), and every 4xx path: bad body, fields,
#    ttl, model, method, unknown / deleted / expired / other tenant's id (404 saying which), the
#    per-tenant bound (429), kinds that do not match;
#  - an explicit cache in use survives an instance restart through the re-warm path.
# Usage: test_prompt_cache_dialects.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# The python with prometheus_client: $BRAID_TEST_PYTHON, else .venv-test/bin/python (scripts/test.sh).
python=${BRAID_TEST_PYTHON:-$root/.venv-test/bin/python}
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"
if ! "$python" -c 'import prometheus_client' 2> /dev/null; then
  echo "FAIL $python lacks prometheus_client (scripts/test.sh installs it into .venv-test)"; exit 1
fi

start_cluster dialects --instances 2 --kv-blocks 256 --events "$work/events.jsonl" || exit 1

"$python" - "$url" "$work/events.jsonl" <<'PY'
import json, sys, time, threading, urllib.request, urllib.error
from prometheus_client.parser import text_string_to_metric_families
url, events_path = sys.argv[1], sys.argv[2]
failures = []
def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f"  ({detail})"), flush=True)
    if not cond: failures.append(name)
def call(method, path, body=None, headers=None, raw=None):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    h = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url + path, data=data, headers=h, method=method)
    try:
        with urllib.request.urlopen(req, timeout=300) as r: return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e: return e.code, json.loads(e.read() or b"null")
def post(body, path="/v1/completions", headers=None): return call("POST", path, body, headers)
def scrape():
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r: text = r.read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)}
def total(fams, family, sample, **labels):
    f = fams.get(family)
    if not f: return None
    return sum(s.value for s in f.samples if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))
def routes():
    out = {}
    for line in open(events_path):
        e = json.loads(line)
        if e.get("event") == "route": out[e["req"]] = e
    return out
def route_of(resp):
    req = int(resp["id"].split("-")[-1])
    for _ in range(50):
        r = routes().get(req)
        if r: return r
        time.sleep(0.1)
    return {}
def ids(start, n): return list(range(start, start + n))
G = {"max_tokens": 2, "temperature": 0}

# ------------------------------------------------------------------ metrics before
before = scrape()
model_name = None
for s in before["vllm:num_requests_running"].samples: model_name = s.labels.get("model_name")
check("metrics: model_name label set", bool(model_name), before["vllm:num_requests_running"].samples)

# ------------------------------------------------------------------ prompt_cache_key
# Two heads cached on different instances: sent together, the second sees the first's load.
placed = None
for attempt in range(4):
    h0, h1 = ids(1000 + attempt * 400, 64), ids(1200 + attempt * 400, 160)
    res = [None, None]
    def send(k, p): res[k] = post({"prompt": p + [5], "max_tokens": 8, "ignore_eos": True, "temperature": 0})
    ts = [threading.Thread(target=send, args=(0, h0)), threading.Thread(target=send, args=(1, h1))]
    for t in ts: t.start()
    for t in ts: t.join()
    if res[0][0] == 200 and res[1][0] == 200:
        i0, i1 = route_of(res[0][1]).get("instance"), route_of(res[1][1]).get("instance")
        if i0 is not None and i1 is not None and i0 != i1: placed = (h0, h1, i0, i1); break
check("cache key: two heads placed on different instances", placed is not None, res)
if placed:
    h0, h1, i0, i1 = placed
    time.sleep(0.5)  # KV events reach the router's index
    st, r = post({"prompt": h0 + [7, 8], **G, "prompt_cache_key": "K"})
    e = route_of(r)
    check("cache key: first keyed request goes where its head is", st == 200 and e.get("instance") == i0, (st, e))
    st, r = post({"prompt": h1[:48] + [9] * 20, **G, "prompt_cache_key": "K"})
    e = route_of(r)
    check("cache key: short overlap elsewhere (3 blocks) yields to the key's instance",
          st == 200 and e.get("instance") == i0 and e.get("reason") == "cache_key", (st, e, i0, i1))
    time.sleep(0.5)
    st, r = post({"prompt": h1 + [11] * 5, **G, "prompt_cache_key": "K"})
    e = route_of(r)
    check("cache key: a long overlap elsewhere (10 blocks) beats the key",
          st == 200 and e.get("instance") == i1 and e.get("reason") != "cache_key", (st, e, i0, i1))
    # per tenant: tenant "t2" never used key K, so nothing moves its request
    st, r = post({"prompt": ids(9000, 40), **G, "prompt_cache_key": "K", "tenant": "t2"})
    check("cache key: scoped per tenant (another tenant's K routes as new)", st == 200 and route_of(r).get("reason") != "cache_key", route_of(r))
for bad, why in [(5, "number"), ("", "empty"), ("x" * 300, "too long")]:
    st, r = post({"prompt": "hi", **G, "prompt_cache_key": bad})
    check(f"cache key: {why} is a 400 naming it", st == 400 and r["error"]["param"] == "prompt_cache_key", (st, r))

# ------------------------------------------------------------------ prompt_cache_retention
st, r = post({"prompt": ids(3000, 40), **G, "prompt_cache_retention": "24h"})
outs = [o for o in r.get("directive_outcomes", []) if o.get("source") == "prompt_cache_retention"] if st == 200 else []
check("retention 24h: pin reported", st == 200 and len(outs) == 1 and outs[0].get("op") == "pin" and outs[0].get("outcome") == "accepted",
      (st, r.get("directive_outcomes")))
st, r = post({"prompt": ids(3100, 40), **G, "prompt_cache_retention": "in_memory"})
check("retention in_memory: 200 without outcome", st == 200 and not r.get("directive_outcomes"), r)
for bad in ["1h", 24, None]:
    if bad is None: continue
    st, r = post({"prompt": "hi", **G, "prompt_cache_retention": bad})
    check(f"retention {bad!r}: 400 naming it", st == 400 and r["error"]["param"] == "prompt_cache_retention", (st, r))

# ------------------------------------------------------------------ explicit caches
doc = " ".join(f"Clause {i}: the tenant shall keep records of shipment {i} for audit." for i in range(25))
msgs = [{"role": "system", "content": "You answer questions about the contract below.\n" + doc}]
st, c = call("POST", "/v1/caches", {"messages": msgs, "ttl": "5m"})
check("caches: create (messages) 200 with id and tokens", st == 200 and c["id"].startswith("cache_") and c["usage"]["total_tokens"] > 200, (st, c))
cid = c.get("id", "none")
check("caches: pin accepted", st == 200 and c.get("pin", {}).get("outcome") == "accepted", c.get("pin"))
check("caches: expiry = prefill end + ttl", st == 200 and 300 <= c["expires_at"] - c["created_at"] <= 360, c)
st, l = call("GET", "/v1/caches")
check("caches: list has it", st == 200 and l["object"] == "list" and [x["id"] for x in l["data"]] == [cid], l)
st, g = call("GET", f"/v1/caches/{cid}")
check("caches: get by id", st == 200 and g["id"] == cid and g["kind"] == "messages", g)
st, r = post({"messages": [{"role": "user", "content": "Which clause covers shipment 7?"}], **G, "cache_id": cid}, "/v1/chat/completions")
cached = r["usage"]["prompt_tokens_details"]["cached_tokens"] if st == 200 else -1
check("caches: chat naming cache_id starts from it (cached)", st == 200 and cached >= c["usage"]["total_tokens"] - 32, (st, r.get("usage"), c["usage"]))
st, r2 = post({"messages": msgs + [{"role": "user", "content": "Which clause covers shipment 7?"}], **G}, "/v1/chat/completions")
check("caches: same as sending the content inline", st == 200 and r2["usage"]["prompt_tokens"] == r["usage"]["prompt_tokens"], (r2.get("usage"), r.get("usage")))
st, p = call("PATCH", f"/v1/caches/{cid}", {"ttl": 900})
check("caches: PATCH ttl moves the expiry", st == 200 and p["ttl_seconds"] == 900 and p["expires_at"] > c["expires_at"] + 500, (st, p))
st, pc = call("POST", "/v1/caches", {"prompt": "Glossary. " + doc, "ttl": 120})
check("caches: create (prompt) 200", st == 200 and pc["kind"] == "prompt", (st, pc))
pid = pc.get("id", "none")
st, r = post({"prompt": " Question: what is clause 3?", **G, "cache_id": pid})
check("caches: completion naming cache_id hits", st == 200 and r["usage"]["prompt_tokens_details"]["cached_tokens"] >= pc["usage"]["total_tokens"] - 16, (st, r))
# 4xx paths
def err(name, st_r, status, needle=""):
    st, r = st_r
    msg = (r or {}).get("error", {}).get("message", "") if isinstance(r, dict) else ""
    check(f"caches 4xx: {name} -> {status}", st == status and needle in msg, (st, r))
err("not JSON", call("POST", "/v1/caches", raw=b"{nope"), 400)
err("neither content", call("POST", "/v1/caches", {"ttl": 60}), 400, "exactly one")
err("both contents", call("POST", "/v1/caches", {"prompt": "a", "messages": msgs}), 400, "exactly one")
err("unknown field", call("POST", "/v1/caches", {"prompt": "a", "colour": 1}), 400, "colour")
err("ttl 0s", call("POST", "/v1/caches", {"prompt": "a", "ttl": "0s"}), 400, "ttl")
err("ttl 25h", call("POST", "/v1/caches", {"prompt": "a", "ttl": "25h"}), 400, "ttl")
err("ttl words", call("POST", "/v1/caches", {"prompt": "a", "ttl": "soon"}), 400, "ttl")
err("bad messages", call("POST", "/v1/caches", {"messages": [{"role": "robot", "content": "x"}]}), 400)
err("wrong model", call("POST", "/v1/caches", {"prompt": "a", "model": "gpt-9"}), 404, "base model")
err("PUT collection", call("PUT", "/v1/caches", {"prompt": "a"}), 405)
err("POST on an id", call("POST", f"/v1/caches/{cid}", {"prompt": "a"}), 405, "GET, PATCH, DELETE")
err("unknown id", call("GET", "/v1/caches/cache_0000000000000000"), 404, "no cache")
err("nested path", call("GET", f"/v1/caches/{cid}/x"), 404)
err("another tenant's id", call("GET", f"/v1/caches/{cid}", headers={"X-Braid-Tenant": "intruder"}), 404, "no cache")
err("another tenant naming it in chat", post({"messages": [{"role": "user", "content": "hi"}], **G, "cache_id": cid, "tenant": "intruder"}, "/v1/chat/completions"), 404)
err("PATCH without ttl", call("PATCH", f"/v1/caches/{cid}", {}), 400, "ttl")
err("PATCH bad ttl", call("PATCH", f"/v1/caches/{cid}", {"ttl": -5}), 400, "ttl")
err("prompt cache in chat", post({"messages": [{"role": "user", "content": "hi"}], **G, "cache_id": pid}, "/v1/chat/completions"), 400, "prompt")
err("messages cache in completions", post({"prompt": "hi", **G, "cache_id": cid}), 400, "messages")
err("token-id prompt with a cache", post({"prompt": [1, 2, 3], **G, "cache_id": pid}), 400, "one string")
err("empty cache_id", post({"prompt": "hi", **G, "cache_id": ""}), 400, "cache_id")
err("non-string cache_id", post({"prompt": "hi", **G, "cache_id": 7}), 400, "cache_id")
err("unknown cache_id in chat", post({"messages": [{"role": "user", "content": "hi"}], **G, "cache_id": "cache_ffffffffffffffff"}, "/v1/chat/completions"), 404, "no cache")
st, d = call("DELETE", f"/v1/caches/{cid}")
check("caches: delete 200 (and the pin ended: unpin accepted)", st == 200 and {k: d.get(k) for k in ("id", "object", "deleted")} == {"id": cid, "object": "cache.deleted", "deleted": True}
      and d.get("unpin", {}).get("outcome") == "accepted", (st, d))
err("deleted id (GET)", call("GET", f"/v1/caches/{cid}"), 404, "was deleted")
err("deleted id (chat)", post({"messages": [{"role": "user", "content": "hi"}], **G, "cache_id": cid}, "/v1/chat/completions"), 404, "was deleted")
err("deleted id (DELETE again)", call("DELETE", f"/v1/caches/{cid}"), 404, "was deleted")
st, e1 = call("POST", "/v1/caches", {"prompt": "short lived", "ttl": "1s"})
check("caches: create ttl 1s", st == 200, (st, e1))
time.sleep(1.5)
err("expired id (completion)", post({"prompt": " more", **G, "cache_id": e1.get("id", "x")}), 404, "expired")
made = [call("POST", "/v1/caches", {"prompt": f"note {k}", "ttl": 60}, headers={"X-Braid-Tenant": "bounded"})[0] for k in range(16)]
check("caches: 16 caches in one tenant", made == [200] * 16, made)
err("17th cache in the tenant", call("POST", "/v1/caches", {"prompt": "one more"}, headers={"X-Braid-Tenant": "bounded"}), 429, "delete one")
st, l = call("GET", "/v1/caches", headers={"X-Braid-Tenant": "bounded"})
check("caches: tenants see their own caches only", st == 200 and len(l["data"]) == 16, len(l.get("data", [])))

# ------------------------------------------------------------------ metrics after
time.sleep(0.5)  # the instances' next stats report
after = scrape()
want = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries": "counter", "vllm:prefix_cache_hits": "counter", "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter", "vllm:request_success": "counter", "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram", "vllm:time_per_output_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram"}
for fam, typ in want.items():
    f = after.get(fam)
    check(f"metrics: {fam} is a {typ}", f is not None and f.type == typ, f and f.type)
    engines = sorted({s.labels.get("engine") for s in f.samples}) if f else []
    check(f"metrics: {fam} per instance with model_name", engines == ["0", "1"] and all(s.labels.get("model_name") == model_name for s in f.samples), engines)
for fam, sample in [("vllm:prefix_cache_queries", "vllm:prefix_cache_queries_total"), ("vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total"),
                    ("vllm:prompt_tokens", "vllm:prompt_tokens_total"), ("vllm:generation_tokens", "vllm:generation_tokens_total"),
                    ("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count"),
                    ("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count"),
                    ("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count")]:
    b, a = total(before, fam, sample), total(after, fam, sample)
    check(f"metrics: {sample} moved", b is not None and a is not None and a > b, (b, a))
for engine in ["0", "1"]:
    n = total(after, "vllm:request_success", "vllm:request_success_total", engine=engine)
    check(f"metrics: engine {engine} counted finished requests", n and n > 0, n)
length = total(after, "vllm:request_success", "vllm:request_success_total", finished_reason="length") - \
         total(before, "vllm:request_success", "vllm:request_success_total", finished_reason="length")
check("metrics: max_tokens finishes counted as finished_reason=length", length >= 10, length)
buckets = [s.labels["le"] for s in after["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_bucket") and s.labels["engine"] == "0"]
check("metrics: TTFT uses vLLM's buckets", buckets[:3] == ["0.001", "0.005", "0.01"] and buckets[-1] == "+Inf" and len(buckets) == 23, buckets)
usage = [s.value for s in after["vllm:kv_cache_usage_perc"].samples]
check("metrics: kv_cache_usage_perc within [0, 1]", all(0 <= u <= 1 for u in usage), usage)
check("metrics: braid_ families still there", "braid_requests" in after or "braid_requests_total" in after, list(after)[:5])
sys.exit(1 if failures else 0)
PY
[ $? = 0 ] && ok "dialects checks" || fail "dialects checks"
stop_cluster dialects

# ---------------------------------------------------------------- an explicit cache survives a restart
# One instance with --restart-instances 1: a cache used once is hot in the coordinator's recorder
# (counted at creation and at its use), so when the instance's leader is killed and spawned again,
# its re-warm prefills the cache's head there and the next request naming the cache hits.
# shellcheck source=rank_pid.sh
source "$root/tests/integration/rank_pid.sh"
# With API keys: the key decides the tenant; no key is a 401, the other tenant's key a 404.
key_a=sk-dialects-a-5d2c8e1f90b34a76
key_b=sk-dialects-b-0e9f7a6b5c4d3e21
printf '%s tenant=alpha\n%s tenant=beta\n' "$key_a" "$key_b" > "$work/keys"
start_cluster restart --instances 1 --restart-instances 1 --api-keys "$work/keys" --max-body-bytes 200000 || exit 1
ask() {  # ask CACHE_ID -> cached_tokens of a chat request naming it (or "error ...")
  curl -s --max-time 120 "$url/v1/chat/completions" -H 'Content-Type: application/json' -H "Authorization: Bearer $key_a" \
    -d "{\"messages\":[{\"role\":\"user\",\"content\":\"Which clause is about pallets?\"}],\"max_tokens\":1,\"cache_id\":\"$1\"}" |
    "$python" -c 'import json, sys; r = json.load(sys.stdin); print(r["usage"]["prompt_tokens_details"]["cached_tokens"] if "usage" in r else "error " + json.dumps(r)[:200])'
}
doc=$("$python" -c 'print(" ".join(f"Clause {i}: pallets of lot {i} ship on weekday {i % 5}." for i in range(30)))')
cid=$(curl -s "$url/v1/caches" -H 'Content-Type: application/json' -H "Authorization: Bearer $key_a" \
  -d "{\"messages\":[{\"role\":\"system\",\"content\":\"$doc\"}],\"ttl\":\"10m\"}" | "$python" -c 'import json, sys; print(json.load(sys.stdin).get("id", ""))')
check "restart: cache created ($cid)" [ -n "$cid" ]
code() { curl -s -o /dev/null -w '%{http_code}' "$@"; }
check "keys: no key is a 401" [ "$(code "$url/v1/caches/$cid")" = 401 ]
check "keys: the owner's key reads it" [ "$(code -H "Authorization: Bearer $key_a" "$url/v1/caches/$cid")" = 200 ]
check "keys: another tenant's key gets a 404" [ "$(code -H "Authorization: Bearer $key_b" "$url/v1/caches/$cid")" = 404 ]
check "keys: naming another tenant the key does not share is a 403" \
  [ "$(code -H "Authorization: Bearer $key_a" -H 'X-Braid-Tenant: beta' "$url/v1/caches")" = 403 ]
"$python" -c 'import json; print(json.dumps({"prompt": "x" * 300000}))' > "$work/big.json"
check "a body over --max-body-bytes is a 413" \
  [ "$(code -H "Authorization: Bearer $key_a" -H 'Content-Type: application/json' -d @"$work/big.json" "$url/v1/caches")" = 413 ]
c=$(ask "$cid")
check "restart: a request naming it hits before the restart ($c)" [ "$c" -gt 100 ] 2> /dev/null
kill -KILL "$(rank_pid 1)"
back() { [ "$(curl -s "$url/health" | "$python" -c 'import json, sys; h = json.load(sys.stdin); print(h["status"], h["instances_alive"])' 2> /dev/null)" = "ready 1" ]; }
rewarmed() { [ "$(curl -s -H "Authorization: Bearer $key_a" "$url/metrics" | awk '$1 == "braid_instance_rewarms_total" {print $2}')" = 1 ]; }
sleep 1
check "restart: the instance is back within 60 s" wait_for 60 back
check "restart: its re-warm finished within 60 s" wait_for 60 rewarmed
c=$(ask "$cid")
check "restart: the cache's head is cached again on the new leader ($c)" [ "$c" -gt 100 ] 2> /dev/null
stop_cluster restart
echo "failures: $failures"
[ "$failures" = 0 ]
