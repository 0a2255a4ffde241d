"""The Anthropic Messages API against a running Braid cluster, with the official anthropic SDK
(tests/integration/test_anthropic_client.sh).

usage: python anthropic_client_test.py BASE_URL MODEL_ID API_KEY SECOND_TENANTS_API_KEY

messages.create (text blocks, stop_reason, usage whose parts add up to count_tokens), a stop
sequence, messages.stream (text deltas reassembled, the final message's usage), tools (tool_choice
any / tool / none, a tool_use block whose input fits the schema, the same streamed with
input_json_delta, a tool_result round trip), cache_control (a 1h breakpoint on the system prompt:
the first call creates cache in the 1h bucket, the second reads it; top-level cache_control; never
echoed: past the tenant's pin budget, creation reports only what was pinned), x-api-key and Bearer auth, a wrong key as
AuthenticationError, and the 4xx paths in Anthropic's error shape.
"""
import json
import sys
import uuid

import anthropic
import httpx

base_url, model, key, key2 = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
client = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0)
failures = []
# This SDK no longer types temperature / top_p / top_k; the server still reads them from the body.
GREEDY = {"temperature": 0}


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def usage_total(u):
    return u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)


HELLO = [{"role": "user", "content": "Say hello to the world."}]

# ---- messages.create
r = client.messages.create(model=model, max_tokens=16, messages=HELLO, extra_body=GREEDY)
check(r.type == "message" and r.role == "assistant" and r.id.startswith("msg_"), f"create: a message object ({r.id})")
check(len(r.content) == 1 and r.content[0].type == "text" and r.content[0].text, "create: one non-empty text block")
check(r.stop_reason in ("end_turn", "max_tokens"), f"create: stop_reason end_turn or max_tokens ({r.stop_reason})")
check(0 < r.usage.output_tokens <= 16, f"create: output_tokens within max_tokens ({r.usage.output_tokens})")
counted = client.messages.count_tokens(model=model, messages=HELLO)
check(counted.input_tokens > 0 and counted.input_tokens == usage_total(r.usage),
      f"count_tokens equals the prompt create ran ({counted.input_tokens} vs {usage_total(r.usage)})")
check(r.usage.cache_creation is not None and r.usage.cache_creation.ephemeral_5m_input_tokens == 0,
      "create without cache_control creates no cache")

r = client.messages.create(model=model, max_tokens=40, extra_body=GREEDY, stop_sequences=[" "],
                           messages=[{"role": "user", "content": "Write a sentence about the sea."}])
check(r.stop_reason == "stop_sequence" and r.stop_sequence == " " and " " not in r.content[0].text,
      f"stop_sequences: stop_reason stop_sequence, the text cut before it ({r.stop_reason}, {r.stop_sequence!r}, {r.content[0].text!r})")

# ---- messages.stream
with client.messages.stream(model=model, max_tokens=16, messages=HELLO, extra_body=GREEDY) as stream:
    pieces = [t for t in stream.text_stream]
    final = stream.get_final_message()
check(len(pieces) > 1 and "".join(pieces) == final.content[0].text, f"stream: {len(pieces)} text deltas reassemble the final text")
check(final.stop_reason in ("end_turn", "max_tokens") and final.usage.output_tokens > 0, "stream: final stop_reason and output_tokens")
check(usage_total(final.usage) == counted.input_tokens, "stream: the final usage covers the whole prompt")
check((final.usage.cache_read_input_tokens or 0) > 0, f"stream: the repeated prompt is read from the cache ({final.usage.cache_read_input_tokens})")

# raw events: the sequence Anthropic sends
with client.messages.stream(model=model, max_tokens=4, messages=HELLO) as stream:
    kinds = [e.type for e in stream if e.type in ("message_start", "content_block_start", "content_block_delta",
                                                   "content_block_stop", "message_delta", "message_stop")]
check(kinds[0] == "message_start" and kinds[1] == "content_block_start" and kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"],
      f"stream: event order message_start, content_block_*, message_delta, message_stop ({kinds[:2]} ... {kinds[-3:]})")

# ---- tools
WEATHER = {"name": "get_weather", "description": "Current weather of a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"},
                                                             "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                            "required": ["city", "unit"]}}
TIME = {"name": "get_time", "description": "Current time in a time zone",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}
SYSTEM = "You are a weather assistant. Use the tools to answer."
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def weather_ok(block):
    i = block.input
    return block.type == "tool_use" and block.name == "get_weather" and isinstance(i, dict) and isinstance(i.get("city"), str) \
        and i.get("unit") in ("celsius", "fahrenheit") and block.id


r = client.messages.create(model=model, max_tokens=80, extra_body=GREEDY, system=SYSTEM, messages=ASK, tools=[WEATHER, TIME],
                           tool_choice={"type": "tool", "name": "get_weather"})
uses = [b for b in r.content if b.type == "tool_use"]
check(r.stop_reason == "tool_use" and len(uses) >= 1 and weather_ok(uses[0]),
      f"tools: tool_choice tool gives a get_weather tool_use whose input fits the schema ({r.stop_reason}, {uses})")
r_any = client.messages.create(model=model, max_tokens=80, extra_body=GREEDY, system=SYSTEM, messages=ASK, tools=[WEATHER, TIME],
                               tool_choice={"type": "any", "disable_parallel_tool_use": True})
any_uses = [b for b in r_any.content if b.type == "tool_use"]
check(r_any.stop_reason == "tool_use" and len(any_uses) == 1 and any_uses[0].name in ("get_weather", "get_time"),
      f"tools: tool_choice any with disable_parallel_tool_use makes exactly one call ({any_uses})")

with client.messages.stream(model=model, max_tokens=80, extra_body=GREEDY, system=SYSTEM, messages=ASK, tools=[WEATHER, TIME],
                            tool_choice={"type": "tool", "name": "get_weather"}) as stream:
    deltas = [e for e in stream if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    streamed = stream.get_final_message()
s_uses = [b for b in streamed.content if b.type == "tool_use"]
check(deltas and s_uses and uses and s_uses[0].input == uses[0].input and streamed.stop_reason == "tool_use",
      "tools, streamed: input_json_delta reassembles into the same tool_use input")

if uses:
    turn2 = ASK + [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in r.content]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 degrees, light rain"}]}]
    r2 = client.messages.create(model=model, max_tokens=40, extra_body=GREEDY, system=SYSTEM, messages=turn2, tools=[WEATHER, TIME],
                                tool_choice={"type": "none"})
    check(r2.stop_reason in ("end_turn", "max_tokens") and r2.content and r2.content[0].type == "text" and r2.content[0].text,
          f"tools: the tool_result round trip answers in text ({r2.stop_reason})")
    check((r2.usage.cache_read_input_tokens or 0) > 0, f"tools: turn 2 reads turn 1's prompt from the cache ({r2.usage.cache_read_input_tokens})")

# ---- cache_control
DOC = " ".join(f"Clause {i}: the tenant {uuid.uuid4().hex[:8]} keeps the garden tidy and pays on day {i % 28 + 1}." for i in range(20))
CACHED_SYSTEM = [{"type": "text", "text": "You answer questions about this lease.\n" + DOC, "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
first = client.messages.create(model=model, max_tokens=8, extra_body=GREEDY, system=CACHED_SYSTEM,
                               messages=[{"role": "user", "content": "Who keeps the garden tidy?"}])
u1 = first.usage
check(u1.cache_creation_input_tokens > 0 and u1.cache_creation.ephemeral_1h_input_tokens == u1.cache_creation_input_tokens
      and u1.cache_creation.ephemeral_5m_input_tokens == 0,
      f"cache_control 1h: the first call creates cache in the 1h bucket ({u1.cache_creation_input_tokens} tokens)")
second = client.messages.create(model=model, max_tokens=8, extra_body=GREEDY, system=CACHED_SYSTEM,
                                messages=[{"role": "user", "content": "When is rent paid?"}])
u2 = second.usage
# Pins hold whole KV blocks (BLOCK tokens): the block holding the breakpoint also holds the start of
# the first call's question, so the second call reads all but that block and creates its own.
BLOCK = 16
check(u2.cache_read_input_tokens > 0 and u2.cache_read_input_tokens >= u1.cache_creation_input_tokens - BLOCK
      and u2.cache_creation_input_tokens <= BLOCK,
      f"cache_control: the second call reads the pinned prefix ({u2.cache_read_input_tokens} read, {u2.cache_creation_input_tokens} created)")
check(usage_total(u2) == client.messages.count_tokens(model=model, system=CACHED_SYSTEM,
                                                      messages=[{"role": "user", "content": "When is rent paid?"}]).input_tokens,
      "cache_control: input + read + creation add up to the prompt")

# top-level cache_control (automatic caching): the breakpoint lands on the last block
LONG_Q = "Summarise these notes: " + " ".join(f"note {i} says {uuid.uuid4().hex[:6]}." for i in range(20))
auto1 = client.messages.create(model=model, max_tokens=4, extra_body=GREEDY, cache_control={"type": "ephemeral"},
                               messages=[{"role": "user", "content": LONG_Q}])
auto2 = client.messages.create(model=model, max_tokens=4, extra_body=GREEDY, cache_control={"type": "ephemeral"},
                               messages=[{"role": "user", "content": LONG_Q}, {"role": "assistant", "content": "Sure."},
                                         {"role": "user", "content": "Shorter, please."}])
check(auto1.usage.cache_creation.ephemeral_5m_input_tokens > 0 and auto2.usage.cache_read_input_tokens >= auto1.usage.cache_creation_input_tokens,
      f"top-level cache_control: creates 5m cache, the next turn reads it ({auto1.usage.cache_creation_input_tokens} created, "
      f"{auto2.usage.cache_read_input_tokens} read)")

# A pin is only what the tenant's pin budget holds (the cluster runs --pin-budget PIN_BUDGET): a
# breakpoint past it reports the tokens actually pinned, not what was asked for. A second tenant
# (key2), so the pins above do not share its budget.
PIN_BUDGET = 1024
beta = anthropic.Anthropic(base_url=base_url, api_key=key2, max_retries=0)
HUGE = [{"type": "text", "text": " ".join(f"Row {i} reads {i * 7 % 101} units on sensor {i % 13}." for i in range(100)),
         "cache_control": {"type": "ephemeral"}}]
QUESTION = [{"role": "user", "content": "Which row reads most?"}]
huge_tokens = beta.messages.count_tokens(model=model, system=HUGE, messages=QUESTION).input_tokens
big = beta.messages.create(model=model, max_tokens=2, extra_body=GREEDY, system=HUGE, messages=QUESTION)
ub = big.usage
check(huge_tokens > PIN_BUDGET + 64 and ub.cache_read_input_tokens == 0 and 0 < ub.cache_creation_input_tokens <= PIN_BUDGET
      and usage_total(ub) == huge_tokens,
      f"cache_control past the pin budget: creation is what was pinned ({ub.cache_creation_input_tokens} of a {huge_tokens}-token "
      f"prompt, budget {PIN_BUDGET})")

# cache_id: a Messages request starts from an explicit cache (POST /v1/caches), as a chat completion does
BRIEF = "You are the archivist. " + " ".join(f"Entry {i}: box {uuid.uuid4().hex[:6]} is on shelf {i % 9}." for i in range(20))
made = httpx.post(base_url.rstrip("/") + "/v1/caches", headers={"x-api-key": key}, timeout=120,
                  json={"messages": [{"role": "system", "content": BRIEF}], "ttl": "5m"})
if made.status_code == 200:
    cache = made.json()
    from_cache = client.messages.create(model=model, max_tokens=4, extra_body={**GREEDY, "cache_id": cache["id"]},
                                        messages=[{"role": "user", "content": "Where is entry 3?"}])
    check(from_cache.usage.cache_read_input_tokens > 0 and usage_total(from_cache.usage) > cache["usage"]["total_tokens"],
          f"cache_id: the request starts from the explicit cache and reads it ({from_cache.usage.cache_read_input_tokens} read)")
    httpx.delete(base_url.rstrip("/") + "/v1/caches/" + cache["id"], headers={"x-api-key": key})
    try:
        client.messages.create(model=model, max_tokens=4, extra_body={"cache_id": cache["id"]}, messages=HELLO)
        check(False, "cache_id: a deleted cache is refused")
    except anthropic.NotFoundError as e:
        check(e.body["error"]["type"] == "not_found_error", "cache_id: a deleted cache is a 404 not_found_error")
else:
    check(False, f"POST /v1/caches works ({made.status_code} {made.text[:200]})")

# ---- auth
bearer = anthropic.Anthropic(base_url=base_url, auth_token=key, max_retries=0)
check(bearer.messages.create(model=model, max_tokens=2, messages=HELLO).type == "message", "auth: Authorization Bearer works too")
try:
    anthropic.Anthropic(base_url=base_url, api_key="wrong-key-0123456789abcdef", max_retries=0).messages.create(
        model=model, max_tokens=2, messages=HELLO)
    check(False, "auth: a wrong x-api-key is refused")
except anthropic.AuthenticationError as e:
    check(e.status_code == 401 and e.body["error"]["type"] == "authentication_error", "auth: a wrong x-api-key is authentication_error 401")
raw = httpx.post(base_url.rstrip("/") + "/v1/messages", json={"model": model, "max_tokens": 2, "messages": HELLO})
check(raw.status_code == 401 and raw.json()["error"]["type"] == "authentication_error", "auth: no key at all is authentication_error 401")


# ---- 4xx paths through the SDK
def refused(what, exc, kind, **kw):
    try:
        client.messages.create(**kw)
        check(False, what)
    except exc as e:
        check(e.body["type"] == "error" and e.body["error"]["type"] == kind, f"{what}: {e.status_code} {kind}")


refused("unknown model", anthropic.NotFoundError, "not_found_error", model="claude-nope", max_tokens=4, messages=HELLO)
refused("1h after 5m", anthropic.BadRequestError, "invalid_request_error", model=model, max_tokens=4,
        system=[{"type": "text", "text": "a", "cache_control": {"type": "ephemeral", "ttl": "5m"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "b", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}])
refused("five breakpoints", anthropic.BadRequestError, "invalid_request_error", model=model, max_tokens=4,
        system=[{"type": "text", "text": f"s{i}", "cache_control": {"type": "ephemeral"}} for i in range(5)], messages=HELLO)
refused("an image block", anthropic.BadRequestError, "invalid_request_error", model=model, max_tokens=4,
        messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
refused("a tool_result answering nothing", anthropic.BadRequestError, "invalid_request_error", model=model, max_tokens=4,
        messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "r"}]}])
refused("a prompt longer than the context", anthropic.BadRequestError, "invalid_request_error", model=model, max_tokens=4,
        messages=[{"role": "user", "content": "word " * 20000}])
raw = httpx.post(base_url.rstrip("/") + "/v1/messages", headers={"x-api-key": key}, json={"model": model, "messages": HELLO})
check(raw.status_code == 400 and "max_tokens" in raw.json()["error"]["message"], "max_tokens is required")
raw = httpx.get(base_url.rstrip("/") + "/v1/messages", headers={"x-api-key": key})
check(raw.status_code == 405 and raw.json()["type"] == "error", "GET /v1/messages is a 405 in Anthropic's shape")
raw = httpx.post(base_url.rstrip("/") + "/v1/messages", headers={"x-api-key": key, "content-type": "text/plain"}, content="hi")
check(raw.status_code == 415 and raw.json()["error"]["type"] == "invalid_request_error", "a non-JSON content type is a 415")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
