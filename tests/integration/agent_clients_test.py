"""Agent clients against a running Braid cluster (tests/integration/test_agent_clients.sh).

usage: python agent_clients_test.py BASE_URL MODEL_ID

With the official openai client: a tool call under tool_choice "required" and a named tool_choice
(id, function.name, arguments as a JSON string that parses and fits the tool's schema,
finish_reason "tool_calls"), the same streamed and reassembled from deltas, a multi-turn
conversation that feeds the tool's result back (the second turn's prompt hits the first's cache),
tool_choice "auto" answering with a call or with text (never both broken), parallel_tool_calls
false making one call, response_format json_schema / json_object producing JSON that validates,
and beta.chat.completions.parse with a Pydantic model. Every malformed tool request is a 400 that
names the field. With langgraph + langchain-openai installed, a prebuilt ReAct agent with two tools
runs against the server: it calls a tool, gets the result and answers, with its workflow labels
sent as headers and cache hits across its turns.
"""
import json
import sys

import openai
import pydantic

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
ASK = [{"role": "system", "content": "You are a weather assistant. Use the tools to answer."},
       {"role": "user", "content": "What is the weather in Paris right now?"}]


def valid_weather_args(args):
    return isinstance(args, dict) and isinstance(args.get("city"), str) and args.get("unit") in ("celsius", "fahrenheit") \
        and set(args) <= {"city", "unit"}


def call_ok(call, name):
    try:
        args = json.loads(call.function.arguments)
    except (TypeError, ValueError):
        return False
    ok_args = valid_weather_args(args) if name == "get_weather" else isinstance(args.get("zone"), str)
    return call.type == "function" and call.id and call.function.name == name and ok_args


# ---- tool_choice required / named, whole answers
r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                   max_tokens=80, temperature=0)
msg = r.choices[0].message
check(r.choices[0].finish_reason == "tool_calls", f"required: finish_reason tool_calls (got {r.choices[0].finish_reason})")
check(bool(msg.tool_calls) and all(call_ok(c, c.function.name) for c in msg.tool_calls),
      f"required: every call names a tool and its arguments fit its schema ({msg.tool_calls})")
first_call = msg.tool_calls[0] if msg.tool_calls else None

r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], max_tokens=80, temperature=0,
                                   tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                   parallel_tool_calls=False)
named = r.choices[0].message
check(named.tool_calls is not None and len(named.tool_calls) == 1 and call_ok(named.tool_calls[0], "get_weather"),
      "named tool_choice with parallel_tool_calls false: exactly one get_weather call with valid arguments")
check(named.content is None, "a tool-call-only answer has content null")

# ---- streamed: deltas reassemble into the same calls
stream = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], max_tokens=80, temperature=0,
                                        tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                        parallel_tool_calls=False, stream=True)
calls, finish, text = {}, None, []
for chunk in stream:
    for ch in chunk.choices:
        if ch.delta.content:
            text.append(ch.delta.content)
        for d in ch.delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            slot["id"] = d.id or slot["id"]
            if d.function and d.function.name:
                slot["name"] += d.function.name
            if d.function and d.function.arguments:
                slot["arguments"] += d.function.arguments
        finish = ch.finish_reason or finish
check(finish == "tool_calls" and len(calls) == 1, f"stream: one call, finish_reason tool_calls (got {finish}, {len(calls)})")
if calls and named.tool_calls:
    s = calls[0]
    check(s["name"] == "get_weather" and json.loads(s["arguments"]) == json.loads(named.tool_calls[0].function.arguments),
          "stream: the reassembled call equals the whole answer's")

# ---- a second turn with the tool's result; it reuses the first turn's cached prompt
if first_call is not None:
    turn2 = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": first_call.id, "type": "function",
         "function": {"name": first_call.function.name, "arguments": first_call.function.arguments}}]},
        {"role": "tool", "tool_call_id": first_call.id, "content": "18 degrees, light rain"}]
    r2 = client.chat.completions.create(model=model, messages=turn2, tools=[WEATHER, TIME], max_tokens=48, temperature=0)
    m2 = r2.choices[0].message
    check(r2.choices[0].finish_reason in ("stop", "length", "tool_calls") and (m2.content or m2.tool_calls),
          f"turn 2 with the tool result answers (finish {r2.choices[0].finish_reason})")
    cached = r2.usage.prompt_tokens_details.cached_tokens if r2.usage.prompt_tokens_details else 0
    check(cached > 0, f"turn 2 hits the cache of turn 1's prompt ({cached} cached tokens)")

# ---- auto: a call or an answer, each well formed
r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], max_tokens=80, temperature=0)
m = r.choices[0].message
if m.tool_calls:
    check(r.choices[0].finish_reason == "tool_calls" and all(call_ok(c, "get_weather") for c in m.tool_calls),
          "auto chose a call: well formed")
else:
    check(isinstance(m.content, str) and r.choices[0].finish_reason in ("stop", "length"), "auto chose text: plain content")
r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="none", max_tokens=8, temperature=0)
check(not r.choices[0].message.tool_calls and r.choices[0].message.content is not None, "tool_choice none: text, no calls")

# ---- structured outputs
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
                                           "age": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
          "required": ["name", "age", "tags"], "additionalProperties": False}
r = client.chat.completions.create(model=model, max_tokens=120, temperature=0,
                                   messages=[{"role": "user", "content": "Describe a person as JSON."}],
                                   response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}})
try:
    obj = json.loads(r.choices[0].message.content)
    good = set(obj) == {"name", "age", "tags"} and isinstance(obj["age"], int) and isinstance(obj["tags"], list) \
        and len(obj["tags"]) <= 3 and all(isinstance(t, str) for t in obj["tags"])
except ValueError:
    obj, good = None, False
check(good, f"json_schema: the answer is JSON that fits the schema ({r.choices[0].message.content!r})")
r = client.chat.completions.create(model=model, max_tokens=200, temperature=0, response_format={"type": "json_object"},
                                   messages=[{"role": "system", "content": "You answer in JSON."},
                                             {"role": "user", "content": "Reply with {\"ok\": true}"}])
try:
    check(r.choices[0].finish_reason == "stop" and isinstance(json.loads(r.choices[0].message.content), dict),
          f"json_object: the answer is a JSON object ({r.choices[0].message.content!r})")
except ValueError:
    check(False, f"json_object: the answer is a JSON object ({r.choices[0].message.content!r})")


class City(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=30)
    country: str = pydantic.Field(max_length=30)
    population_millions: float


try:
    parsed = client.beta.chat.completions.parse(model=model, max_tokens=80, temperature=0, response_format=City,
                                                messages=[{"role": "user", "content": "Tell me about Paris."}])
    city = parsed.choices[0].message.parsed
    check(isinstance(city, City), f"beta.chat.completions.parse gives a City ({city!r})")
except Exception as e:  # noqa: BLE001 - any failure of the official helper is the finding
    check(False, f"beta.chat.completions.parse with a Pydantic model: {e!r}")

# ---- bad input: 400s naming the field
bad = [
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "patternProperties": {}}}}},
     "response_format.json_schema.schema"),
]
for extra, param in bad:
    try:
        client.chat.completions.create(model=model, messages=ASK, max_tokens=4, **extra)
        check(False, f"400 naming {param}")
    except openai.BadRequestError as e:
        check(e.body.get("param") == param if isinstance(e.body, dict) else False, f"400 naming {param}")
try:
    client.chat.completions.create(model=model, max_tokens=4, messages=ASK + [{"role": "tool", "tool_call_id": "zz", "content": "x"}])
    check(False, "a tool message answering no call: 400")
except openai.BadRequestError as e:
    check("tool_call_id" in str(e), "a tool message answering no call: 400 naming tool_call_id")


# ---- a real agent framework, when installed
def run_langgraph():
    try:
        from langchain_core.tools import tool
        from langchain_openai import ChatOpenAI
        from langgraph.prebuilt import create_react_agent
    except ImportError as e:
        print(f"skip langgraph agent: {e}")
        return

    seen = []

    @tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        seen.append(("get_weather", city))
        return f"It is 18 degrees and raining in {city}."

    @tool
    def get_time(zone: str) -> str:
        """Current time in a time zone."""
        seen.append(("get_time", zone))
        return "12:00"

    tools = [get_weather, get_time]
    llm = ChatOpenAI(model=model, base_url=base_url, api_key="unused", temperature=0, max_tokens=64, max_retries=0,
                     default_headers={"X-Braid-Workflow": "langgraph-1", "X-Braid-Agent": "react"})
    calling, answering = llm.bind_tools(tools, tool_choice="required"), llm.bind_tools(tools, tool_choice="none")

    # A 135M model left to choose may answer at once; the agent's first step is made to call a tool
    # and its step after a tool result to answer, so the run is the same every time. The loop
    # (model -> tools -> model) is LangGraph's own.
    def pick_model(state, runtime=None):
        return answering if any(m.type == "tool" for m in state["messages"]) else calling

    agent = create_react_agent(pick_model, tools)
    out = agent.invoke({"messages": [("user", "What is the weather in Paris?")]}, {"recursion_limit": 6})
    msgs = out["messages"]
    ai = [m for m in msgs if m.type == "ai"]
    check(len(seen) >= 1 and any(m.type == "tool" for m in msgs), f"langgraph ReAct agent called a tool ({seen})")
    check(bool(ai) and bool(ai[0].tool_calls) and ai[-1].content and not ai[-1].tool_calls,
          f"langgraph: the agent called, got the result and answered ({ai[-1].content!r})")
    cached = [((m.response_metadata.get("token_usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0) for m in ai]
    check(len(cached) >= 2 and cached[-1] > 0, f"langgraph: the agent's later turn hits the cache of its earlier one ({cached})")


try:
    run_langgraph()
except Exception as e:  # noqa: BLE001 - any failure of the framework's run is the finding
    check(False, f"langgraph agent ran ({type(e).__name__}: {e})")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
