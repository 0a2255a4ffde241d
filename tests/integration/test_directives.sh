#!/usr/bin/env bash
# Cache directives (Leyline, issue 18) end to end over HTTP with the real model:
#  - splice, amortize: a request carrying the cached conversation and a splice (one word swapped)
#    computes only the replacement: the context after the edit is rotated from the cache
#    (directive outcome accepted, rotated_tokens = downstream_tokens > 0; cached + reused covers
#    all but a handful of prompt tokens); forget: the context's cache from the edit on is dropped;
#  - atomicity: a turn whose second directive is invalid is a 400 naming it and changes nothing
#    (its valid first directive, an evict, did not run: the conversation still hits);
#  - pins survive pressure until their TTL; a pin over the tenant's budget is clipped and says so;
#  - cache_control {"type": "ephemeral"} pins through its message, reported per message;
#  - tenants: another tenant never hits a tenant's cache unless it shared it, then copies it; a
#    third tenant still gets nothing;
#  - braid batch applies directives from its input lines and reports outcomes.
# Usage: test_directives.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

# A small pool (160 blocks of 16 tokens) so that pressure is cheap to make.
start_cluster directives --instances 1 --kv-blocks 160 --pin-budget 800 || exit 1

python3 - "$url" "$work" <<'PY'
import json, sys, time, urllib.request, urllib.error
url, work = sys.argv[1], sys.argv[2]
failures = []
def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f"  ({detail})"), flush=True)
    if not cond: failures.append(name)
def post(body, path="/v1/chat/completions"):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r: return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e: return e.code, json.loads(e.read())
def usage(r):
    d = r["usage"]["prompt_tokens_details"]
    return r["usage"]["prompt_tokens"], d["cached_tokens"], d["segment_reused_tokens"]
def outcomes(r): return {o.get("index", o.get("message")): o for o in r.get("directive_outcomes", [])}

def conversation(topic, n=30):
    rules = " ".join(f"Rule {i}: be precise about quantities and timing in {topic} recipe number {i}." for i in range(n))
    return [{"role": "system", "content": "You are a helpful cooking assistant. " + rules},
            {"role": "user", "content": f"How do I get the consistency of {topic} right when I'm a beginner? Mention stock, stirring and resting."},
            {"role": "assistant", "content": "Use warm stock, add it a ladle at a time, stir often, and let it rest two minutes with butter."},
            {"role": "user", "content": f"What are the most common mistakes people make with {topic}, and how do I avoid them?"}]
G = {"max_tokens": 6, "temperature": 0}

# --- splice, amortize ---
conv = conversation("risotto")
st, r = post({"messages": conv, **G})
check("prime: 200", st == 200, r)
splice = {"op": "splice", "span": {"match": "consistency of risotto"}, "replacement": "consistency of paella", "mode": "amortize"}
st, r = post({"messages": conv, **G, "directives": [splice]})
check("amortize: 200", st == 200, r)
o = outcomes(r).get(0, {})
check("amortize: outcome accepted", o.get("outcome") == "accepted" and o.get("mode") == "amortize", r.get("directive_outcomes"))
check("amortize: downstream rotated (the context's partial last block aside)", o.get("rotated_tokens", 0) > 50 and 0 <= o.get("recomputed_tokens", -1) < 16, o)
n, cached, reused = usage(r)
check("amortize: only the replacement computed", n - cached - reused <= 16, (n, cached, reused))
# the spliced prompt is the edited conversation: same token count as rendering it
edited = [dict(m) for m in conv]; edited[1]["content"] = edited[1]["content"].replace("risotto", "paella", 1)
st, plain = post({"messages": edited, **G})
check("amortize: the spliced prompt is the edited conversation", plain["usage"]["prompt_tokens"] == n, (plain["usage"], n))

# --- atomicity ---
conv2 = conversation("curry")
post({"messages": conv2, **G})
st, r = post({"messages": conv2, **G, "directives": [{"op": "evict"}, {"op": "splice", "span": [10, 100000], "replacement": "x"}]})
check("atomic: invalid second directive is a 400 naming it", st == 400 and r["error"]["param"] == "directives[1].span", r)
st, r = post({"messages": conv2, **G})
check("atomic: the first directive (evict) did not run", usage(r)[1] > 400, r["usage"])
cached_before_forget = usage(r)[1]
st, r = post({"messages": conv2, **G, "directives": [{"op": "splice", "span": [5, 9], "replacement": "a"}, {"op": "splice", "span": [8, 12], "replacement": "b"}]})
check("overlapping splices are a 400", st == 400 and "overlaps" in r["error"]["message"], r)
st, r = post({"messages": conv2, **G, "directives": [{"op": "pin", "ttl": "9y"}]})
check("a bad ttl is a 400 naming it", st == 400 and r["error"]["param"] == "directives[0].ttl", r)
st, r = post({"messages": conv2, **G, "directives": [{"op": "fold"}]})
check("an unknown op is a 400", st == 400 and r["error"]["param"] == "directives[0].op", r)

# --- forget ---
st, r = post({"messages": conv2, **G, "directives": [{"op": "splice", "span": {"match": "consistency of curry"}, "replacement": "texture of curry", "mode": "forget"}]})
o = outcomes(r).get(0, {})
check("forget: accepted, context dropped from the edit", st == 200 and o.get("mode") == "forget" and o.get("dropped_tokens", 0) > 0, r.get("directive_outcomes"))
st, r = post({"messages": conv2, **G})
n2, c2, _ = usage(r)
check("forget: the original's tail (some 70 tokens after the edit) no longer hits", c2 <= cached_before_forget - 48, (r["usage"], cached_before_forget))

# --- pins under pressure, TTL, budget ---
pinned = conversation("sourdough", 20)
st, r = post({"messages": pinned, **G, "directives": [{"op": "pin", "ttl": "10m"}]})
o = outcomes(r).get(0, {})
check("pin: accepted", o.get("outcome") == "accepted" and o.get("tokens", 0) > 300, r.get("directive_outcomes"))
short = conversation("omelette", 20)
st, r = post({"messages": short, **G, "directives": [{"op": "pin", "ttl": "2s"}]})
check("short pin: accepted", outcomes(r).get(0, {}).get("outcome") in ("accepted", "clipped"), r.get("directive_outcomes"))
time.sleep(3)
for i in range(8):  # about 6 pools' worth of other prompts
    post({"messages": conversation(f"filler dish {i} with extra words", 30), **G})
st, r = post({"messages": pinned, **G})
n, cached, _ = usage(r)
check("pin: the pinned prompt survived the pressure", cached >= o.get("tokens", 10**9) - 16, (r["usage"], o))
st, r = post({"messages": short, **G})
check("pin: the expired pin did not (it left the device)", r["usage"]["prompt_tokens_details"]["cached_tokens_device"] < 100, r["usage"])
big = conversation("stew", 45)
st, r = post({"messages": big, **G, "directives": [{"op": "pin", "ttl": "10m"}]})
o = outcomes(r).get(0, {})
check("pin: over the budget is clipped, with the amount", o.get("outcome") == "clipped" and 0 < o.get("tokens", 0) < o.get("asked_tokens", 0) and o.get("reason"), o)

# --- cache_control ---
cc = conversation("gnocchi", 10)
cc[0] = dict(cc[0], cache_control={"type": "ephemeral", "ttl": "5m"})
st, r = post({"messages": cc, **G, "tenant": "cc"})
o = outcomes(r).get(0, {})
check("cache_control: pins through its message", st == 200 and o.get("source") == "cache_control" and o.get("op") == "pin" and o.get("outcome") == "accepted" and 0 < o.get("tokens", 0) < r["usage"]["prompt_tokens"], r.get("directive_outcomes"))
st, r = post({"messages": [dict(cc[0], cache_control={"type": "persistent"})] + cc[1:], **G})
check("cache_control: a wrong type is a 400", st == 400 and r["error"]["param"] == "messages[0].cache_control", r)

# --- tenants ---
doc = conversation("paella", 25)
st, r = post({"messages": doc, **G, "tenant": "acme"})
st, r = post({"messages": doc, **G, "tenant": "globex"})
check("tenants: no cross-tenant hit without sharing", usage(r)[1] == 0 and usage(r)[2] == 0, r["usage"])
st, r = post({"messages": doc, **G, "tenant": "acme", "directives": [{"op": "share", "span": {"match": "recipe number 20."}, "with": ["initech"]}]})
check("share: accepted", outcomes(r).get(0, {}).get("outcome") == "accepted", r.get("directive_outcomes"))
st, r = post({"messages": doc, **G, "tenant": "hooli"})
check("share: a tenant it was not shared with still gets nothing", usage(r)[1] == 0 and usage(r)[2] == 0, r["usage"])
st, r = post({"messages": doc, **G, "tenant": "initech"})
check("share: the named tenant copies the shared prefix", usage(r)[2] > 300, r["usage"])

with open(f"{work}/failures", "w") as f: f.write("\n".join(failures))
PY
[ -s "$work/failures" ] && fail "HTTP directive checks: $(tr '\n' ',' < "$work/failures")" || ok "HTTP directive checks"
sleep 2.5 # a stats report
curl -s "$url/metrics" > "$work/metrics"
check "metrics: requests with directives counted" grep -qE '^braid_directive_requests_total [1-9]' "$work/metrics"
check "metrics: pins counted" grep -qE '^braid_kv_pins_total [1-9]' "$work/metrics"
check "metrics: spliced tokens counted" grep -qE '^braid_kv_spliced_tokens_total [1-9]' "$work/metrics"
check "metrics: shared-prefix tokens counted" grep -qE '^braid_kv_shared_hit_tokens_total [1-9]' "$work/metrics"
stop_cluster directives

# --- braid batch ---
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
sysmsg = "You are a helpful assistant. " + " ".join(f"Fact {i}: the tower of city {i} is {i * 7 % 50} metres tall." for i in range(40))
msgs = [{"role": "system", "content": sysmsg}, {"role": "user", "content": "Which city has the tallest tower? Answer briefly."}]
with open(f"{work}/batch.jsonl", "w") as f:
    f.write(json.dumps({"id": "prime", "messages": msgs, "max_tokens": 4}) + "\n")
    f.write(json.dumps({"id": "splice", "messages": msgs, "max_tokens": 4, "directives": [
        {"op": "splice", "span": {"match": "Fact 3:"}, "replacement": "Fact three:"}, {"op": "pin", "ttl": "1h"}]}) + "\n")
    f.write(json.dumps({"id": "bad", "messages": msgs, "max_tokens": 4, "directives": [{"op": "splice", "span": {"match": "no such text"}, "replacement": "x"}]}) + "\n")
PY
"$braid" batch --model "$model" --input "$work/batch.jsonl" --output "$work/batch.out" --max-running 1 --threads 2 \
  2> "$work/batch.err" > /dev/null || fail "batch exited $?"
check "batch: splice outcome reported" python3 -c '
import json,sys
rows={json.loads(l)["id"]: json.loads(l) for l in open(sys.argv[1])}
o=rows["splice"]["directive_outcomes"]
assert o[0]["op"]=="splice" and o[0]["rotated_tokens"]>100 and o[1]["op"]=="pin", o
assert "error" in rows["bad"] and "occurs 0 times" in rows["bad"]["error"], rows["bad"]' "$work/batch.out"
echo "$failures failure(s)"
[ "$failures" = 0 ]
