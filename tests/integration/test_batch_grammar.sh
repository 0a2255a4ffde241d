#!/usr/bin/env bash
# Structured outputs through `braid batch` on the real model: response_format json_object and
# json_schema, a raw grammar spec (prefix + enum), a forced tool call, greedy and sampled; each
# output that stops must parse as JSON and validate against its schema (Python's jsonschema when
# installed, else the parse and the required keys), and lines with unsupported schemas get an
# error naming the keyword while the others are served.
#   test_batch_grammar.sh BRAID_BINARY MODEL_PATH
set -euo pipefail
braid=$1
model=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/in.jsonl" <<'JSONL'
{"id":"object","messages":[{"role":"user","content":"Describe a cat as a JSON object."}],"max_tokens":80,"response_format":{"type":"json_object"}}
{"id":"schema","messages":[{"role":"user","content":"Give me a person as JSON with name and age."}],"max_tokens":80,"response_format":{"type":"json_schema","json_schema":{"name":"person","strict":true,"schema":{"type":"object","properties":{"name":{"type":"string","maxLength":30},"age":{"type":"integer"},"pets":{"type":"array","items":{"enum":["cat","dog","fish"]},"maxItems":3}},"required":["name","age"],"additionalProperties":false}}}}
{"id":"sampled","messages":[{"role":"user","content":"Give me a person as JSON with name and age."}],"max_tokens":80,"temperature":0.9,"seed":7,"response_format":{"type":"json_schema","json_schema":{"name":"person","schema":{"type":"object","properties":{"name":{"type":"string","maxLength":30},"age":{"type":"integer"}},"required":["name","age"]}}}}
{"id":"raw","prompt":"Is water wet? The answer is","max_tokens":8,"grammar":{"prefix":" ","schema":{"enum":["yes","no"]}}}
{"id":"tool","messages":[{"role":"user","content":"What is the weather in Paris?"}],"max_tokens":80,"grammar":{"prefix":"<tool_call>\n","suffix":"\n</tool_call>","schema":{"anyOf":[{"type":"object","properties":{"name":{"const":"get_weather"},"arguments":{"type":"object","properties":{"city":{"type":"string","maxLength":20}},"required":["city"]}},"required":["name","arguments"]}]}}}
{"id":"bad_keyword","prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"b","schema":{"type":"object","properties":{"n":{"type":"integer","multipleOf":3}}}}}}
{"id":"bad_type","prompt":"x","response_format":{"type":"xml"}}
JSONL
"$braid" batch --model "$model" --input "$tmp/in.jsonl" --output "$tmp/out.jsonl" --kv-blocks 256 2> "$tmp/log"
python3 - "$tmp/in.jsonl" "$tmp/out.jsonl" <<'PY'
import json, sys
inputs = {}
for line in open(sys.argv[1]):
    o = json.loads(line)
    inputs[o["id"]] = o
try:
    import jsonschema
except ImportError:
    jsonschema = None
failed = 0
def check(name, ok, detail=""):
    global failed
    print(("ok   " if ok else "FAIL ") + name + (": " + detail if detail and not ok else ""))
    failed += not ok
def schema_of(o):
    if "response_format" in o:
        rf = o["response_format"]
        return {"type": "object"} if rf["type"] == "json_object" else rf["json_schema"]["schema"]
    return o["grammar"]["schema"]
outs = {json.loads(l)["id"]: json.loads(l) for l in open(sys.argv[2])}
for rid in ("object", "schema", "sampled", "raw", "tool"):
    r = outs[rid]
    check(f"{rid}: served", "error" not in r and r["finish_reason"] in ("stop", "length"), json.dumps(r)[:300])
    if r["finish_reason"] != "stop":
        continue
    text = r["text"]
    g = inputs[rid].get("grammar", {})
    pre, suf = g.get("prefix", ""), g.get("suffix", "")
    check(f"{rid}: prefix and suffix", text.startswith(pre) and text.endswith(suf), repr(text))
    body = text[len(pre):len(text) - len(suf) if suf else None]
    try:
        value = json.loads(body)
    except ValueError as e:
        check(f"{rid}: output parses as JSON", False, f"{body!r}: {e}")
        continue
    check(f"{rid}: output parses as JSON", True)
    schema = schema_of(inputs[rid])
    if jsonschema:
        try:
            jsonschema.validate(value, schema)
            check(f"{rid}: validates (jsonschema)", True)
        except jsonschema.ValidationError as e:
            check(f"{rid}: validates (jsonschema)", False, str(e)[:300])
    else:
        req = schema.get("required", [])
        check(f"{rid}: required keys present", all(k in value for k in req), repr(value))
stopped = sum(outs[i]["finish_reason"] == "stop" for i in ("object", "schema", "sampled", "raw", "tool"))
check("most constrained outputs complete (stop)", stopped >= 3, f"{stopped} of 5")
check("bad_keyword: refused naming the keyword", "multipleOf" in outs["bad_keyword"].get("error", ""), json.dumps(outs["bad_keyword"]))
check("bad_type: refused", "not supported" in outs["bad_type"].get("error", ""), json.dumps(outs["bad_type"]))
sys.exit(1 if failed else 0)
PY
grep -q "structured outputs:" "$tmp/log" && echo "ok   summary line" || { echo "FAIL summary line"; exit 1; }
