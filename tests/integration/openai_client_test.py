"""The official openai Python client against a running Braid cluster (tests/integration/test_cluster.sh).

usage: python openai_client_test.py BASE_URL MODEL_ID
Checks a non-streamed chat, a streamed chat with usage, a completion, and that a repeated long
prefix is reported as cached (prompt_tokens_details.cached_tokens) on the second request.
"""
import sys

import openai

base_url, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base_url, api_key="unused")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


models = client.models.list()
# The base model first; the cluster also loads one LoRA adapter (lora-a), listed after it.
check([m.id for m in models.data][:1] == [model], f"models.list() names {model} first")

chat = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Name a color."}], max_tokens=8, temperature=0)
check(chat.object == "chat.completion" and chat.choices[0].message.role == "assistant", "chat completion shape")
check(len(chat.choices[0].message.content) > 0, "chat completion has text")
check(chat.usage.completion_tokens >= 1 and chat.usage.prompt_tokens > 0, "chat usage counts tokens")
check(chat.choices[0].finish_reason in ("stop", "length"), "chat finish_reason")

pieces, usage, finish = [], None, None
stream = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12, temperature=0,
    stream=True, stream_options={"include_usage": True})
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
check(len(pieces) >= 2, f"stream delivered {len(pieces)} content pieces")
check(finish in ("stop", "length"), "stream ended with a finish_reason")
check(usage is not None and usage.completion_tokens >= 1, "stream usage chunk (include_usage)")

unstreamed = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Count to five."}], max_tokens=12, temperature=0)
check(unstreamed.choices[0].message.content == "".join(pieces), "streamed text equals the non-streamed text")

completion = client.completions.create(model=model, prompt="The sky is", max_tokens=6, temperature=0)
check(completion.object == "text_completion" and len(completion.choices[0].text) > 0, "text completion")

shared = "You are a careful planner for a software team. " * 12
first = client.chat.completions.create(
    model=model, messages=[{"role": "system", "content": shared}, {"role": "user", "content": "Plan step one."}],
    max_tokens=4, temperature=0)
second = client.chat.completions.create(
    model=model, messages=[{"role": "system", "content": shared}, {"role": "user", "content": "Plan step two."}],
    max_tokens=4, temperature=0)
cached = second.usage.prompt_tokens_details.cached_tokens
check(cached >= 64, f"repeated prefix is cached on the second request ({cached} of {second.usage.prompt_tokens} tokens)")

try:
    client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    check(False, "unknown model is refused")
except openai.NotFoundError as e:
    check(e.status_code == 404, "unknown model -> 404 NotFoundError")

print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
