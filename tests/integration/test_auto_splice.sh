#!/usr/bin/env bash
# Leyline edits that last, and edits the server finds itself (issue 36), end to end over HTTP with
# the real model:
#  - conversation scope: after an amortized splice, the same workflow's later turns (no
#    directives, no segment_reuse) keep hitting the spliced (approximate) blocks, three turns on;
#    an exact request of another workflow of the same tenant hits only the prefix before the edit
#    (and its exact K/V then replace the approximate ones for everyone); an explicit
#    conversation_id scopes the same way;
#  - auto_splice: a conversation that sends its prompt edited (an early word changed) with
#    "auto_splice": "amortize" gets the splice planned by the server: an outcome with "auto": true,
#    the context after the edit rotated, nearly nothing computed; "forget" drops the old tail; a
#    bad value is a 400; a request that only extends its conversation gets no splice.
#  - braid batch: auto_splice lines are planned against the conversation's earlier lines.
# Usage: test_auto_splice.sh BRAID_BINARY MODEL_PATH
set -u
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

start_cluster auto_splice --instances 1 --kv-blocks 400 || exit 1

python3 - "$url" "$work" <<'PY'
import json, sys, urllib.request, urllib.error
url, work = sys.argv[1], sys.argv[2]
failures = []
def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + ("" if cond else f"  ({detail})"), flush=True)
    if not cond: failures.append(name)
def post(body):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r: return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e: return e.code, json.loads(e.read())
def usage(r):
    d = r["usage"]["prompt_tokens_details"]
    return r["usage"]["prompt_tokens"], d["cached_tokens"], d["segment_reused_tokens"]
def outcomes(r): return {o.get("index"): o for o in r.get("directive_outcomes", [])}

def conversation(topic, assistant_kind="cooking", n=24):
    rules = " ".join(f"Rule {i}: be precise about quantities and timing in {topic} recipe number {i}." for i in range(n))
    return [{"role": "system", "content": f"You are a helpful {assistant_kind} assistant. " + rules},
            {"role": "user", "content": f"How do I get {topic} right when I'm a beginner?"}]
def turn(msgs, k):
    return msgs + [{"role": "assistant", "content": f"Answer number {k}: go slowly and taste often."},
                   {"role": "user", "content": f"Follow-up question {k}: what should I do next with it?"}]
G = {"max_tokens": 4, "temperature": 0}

# --- conversation scope ---
conv = conversation("risotto")
edited = [dict(conv[0], content=conv[0]["content"].replace("helpful cooking", "helpful baking", 1))] + conv[1:]
post({"messages": conv, **G, "workflow_id": "wf-a"})
splice = {"op": "splice", "span": {"match": "helpful cooking"}, "replacement": "helpful baking", "mode": "amortize"}
st, r = post({"messages": conv, **G, "workflow_id": "wf-a", "directives": [splice]})
check("splice: amortized", st == 200 and outcomes(r).get(0, {}).get("rotated_tokens", 0) > 300, r.get("directive_outcomes"))
n_splice = r["usage"]["prompt_tokens"]
msgs = edited
for k in range(1, 4):
    msgs = turn(msgs, k)
    st, r = post({"messages": msgs, **G, "workflow_id": "wf-a"})
    n, cached, _ = usage(r)
    check(f"scope: turn {k} after the splice hits the spliced blocks", st == 200 and cached >= n_splice - 16, (r["usage"], n_splice))
st, r = post({"messages": turn(edited, 1), **G, "workflow_id": "wf-b"})
check("scope: another workflow's exact request hits only the prefix before the edit", usage(r)[1] < 32, r["usage"])
st, r = post({"messages": turn(edited, 1), **G})
check("scope: its exact K/V replaced the approximate ones: now everyone hits them", usage(r)[1] > 300, r["usage"])

conv_c = conversation("polenta")
edited_c = [dict(conv_c[0], content=conv_c[0]["content"].replace("helpful cooking", "helpful grilling", 1))] + conv_c[1:]
post({"messages": conv_c, **G, "conversation_id": "chat-7"})
st, r = post({"messages": conv_c, **G, "conversation_id": "chat-7",
              "directives": [{"op": "splice", "span": {"match": "helpful cooking"}, "replacement": "helpful grilling"}]})
st, r = post({"messages": turn(edited_c, 1), **G, "conversation_id": "chat-7"})
check("scope: conversation_id's next turn hits the spliced blocks", usage(r)[1] > 300, r["usage"])
st, r = post({"messages": turn(edited_c, 2), **G, "conversation_id": "chat-8"})
check("scope: another conversation_id does not", usage(r)[1] < 32, r["usage"])

# --- auto_splice ---
doc = conversation("gnocchi")
st, r = post({"messages": doc, **G, "workflow_id": "wf-auto", "auto_splice": "amortize"})
check("auto: the first turn plans nothing", st == 200 and not r.get("directive_outcomes"), r.get("directive_outcomes"))
doc_edit = [dict(doc[0], content=doc[0]["content"].replace("helpful cooking", "helpful pasta", 1))] + doc[1:]
st, r = post({"messages": doc_edit, **G, "workflow_id": "wf-auto", "auto_splice": "amortize"})
o = (r.get("directive_outcomes") or [{}])[0]
check("auto: the edit is spliced by the server", st == 200 and o.get("auto") is True and o.get("mode") == "amortize"
      and o.get("rotated_tokens", 0) > 300, r.get("directive_outcomes"))
n, cached, reused = usage(r)
check("auto: only the replacement computed", n - cached - reused <= 20, r["usage"])
st, r = post({"messages": turn(doc_edit, 1), **G, "workflow_id": "wf-auto", "auto_splice": "amortize"})
check("auto: a turn that only extends the conversation gets no splice, and hits", not r.get("directive_outcomes") and usage(r)[1] > 300,
      (r.get("directive_outcomes"), r["usage"]))
doc2 = conversation("ramen")
post({"messages": doc2, **G, "workflow_id": "wf-forget", "auto_splice": "forget"})
doc2_edit = [dict(doc2[0], content=doc2[0]["content"].replace("helpful cooking", "helpful noodle", 1))] + doc2[1:]
st, r = post({"messages": doc2_edit, **G, "workflow_id": "wf-forget", "auto_splice": "forget"})
o = (r.get("directive_outcomes") or [{}])[0]
check("auto forget: the old tail is dropped", st == 200 and o.get("auto") is True and o.get("mode") == "forget" and o.get("dropped_tokens", 0) > 300,
      r.get("directive_outcomes"))
st, r = post({"messages": doc, **G, "auto_splice": "always"})
check("auto: a bad value is a 400 naming it", st == 400 and r["error"]["param"] == "auto_splice", r)

with open(f"{work}/failures", "w") as f: f.write("\n".join(failures))
PY
[ -s "$work/failures" ] && fail "HTTP checks: $(tr '\n' ',' < "$work/failures")" || ok "HTTP checks"
stop_cluster auto_splice

# --- braid batch ---
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
sysmsg = "You are a helpful assistant. " + " ".join(f"Fact {i}: the tower of city {i} is {i * 7 % 50} metres tall." for i in range(40))
msgs = [{"role": "system", "content": sysmsg}, {"role": "user", "content": "Which city has the tallest tower? Answer briefly."}]
edited = [dict(msgs[0], content=sysmsg.replace("Fact 3:", "Fact three:"))] + msgs[1:]
with open(f"{work}/batch.jsonl", "w") as f:
    f.write(json.dumps({"id": "prime", "messages": msgs, "max_tokens": 4, "workflow_id": "w", "auto_splice": "amortize"}) + "\n")
    f.write(json.dumps({"id": "edit", "messages": edited, "max_tokens": 4, "workflow_id": "w", "auto_splice": "amortize"}) + "\n")
PY
"$braid" batch --model "$model" --input "$work/batch.jsonl" --output "$work/batch.out" --max-running 1 --threads 2 \
  2> "$work/batch.err" > /dev/null || fail "batch exited $?"
check "batch: auto_splice planned and reported" python3 -c '
import json,sys
rows={json.loads(l)["id"]: json.loads(l) for l in open(sys.argv[1])}
assert "directive_outcomes" not in rows["prime"], rows["prime"]
o=rows["edit"]["directive_outcomes"]
assert o[0]["op"]=="splice" and o[0]["auto"] is True and o[0]["rotated_tokens"]>100, o' "$work/batch.out"
echo "$failures failure(s)"
[ "$failures" = 0 ]
