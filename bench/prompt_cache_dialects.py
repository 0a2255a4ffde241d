#!/usr/bin/env python3
"""The same prompt-caching workload through each dialect Braid speaks (issue 32), side by side.

Workload: USERS users, each with a private document (DOC_WORDS words) behind one short system head
that every prompt shares; each user asks BURST questions that arrive GAP seconds apart (the next one
while the previous one is still prefilling), users one after another. Prompts of one user share
the head and the document; prompts of different users share only the head.

Dialects, each in a tenant of its own (so each starts cold on the same warm server):
  plain      OpenAI chat, the document in the system message
  key        the same plus prompt_cache_key = the user
  explicit   POST /v1/caches once per user (the document), then chat requests naming cache_id
  anthropic  POST /v1/messages with cache_control on the system block (skipped when the server has
             no /v1/messages)

Reported per dialect: prompt tokens, cached tokens (as each dialect's usage reports them), hit rate,
and TTFT (client-side, streaming: request sent -> first content byte) median / p90 / mean. The
explicit dialect's cache creation (one prefill per user) is reported on its own line, not mixed
into the request figures.
Usage: prompt_cache_dialects.py URL   (env: USERS=6 BURST=4 GAP=0.05 DOC_WORDS=260 SEED=7, DIALECTS="plain key ...")
"""
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request

URL = sys.argv[1]
USERS = int(os.environ.get("USERS", 6))
BURST = int(os.environ.get("BURST", 4))
GAP = float(os.environ.get("GAP", 0.05))
DOC_WORDS = int(os.environ.get("DOC_WORDS", 260))
SEED = int(os.environ.get("SEED", 7))
MAX_TOKENS = 4
with urllib.request.urlopen(URL + "/v1/models", timeout=30) as _r:
    MODEL = json.loads(_r.read())["data"][0]["id"]  # the served model: Anthropic's API requires one
HEAD = "You are a support assistant. Answer from the customer's file only."
WORDS = ("account invoice shipment carrier parcel refund warranty contract clause region tariff "
         "customs depot route pallet weight volume signature delivery window").split()


def document(user):
    rng = random.Random(SEED * 1000 + user)
    return f"Customer file {user}: " + " ".join(rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(DOC_WORDS))


def question(user, k):
    return f"Question {k} from customer {user}: what does the file say about item {k * 7 + user}?"


def request(path, body, tenant, headers=None):
    h = {"Content-Type": "application/json", "X-Braid-Tenant": tenant, **(headers or {})}
    return urllib.request.Request(URL + path, data=json.dumps(body).encode(), headers=h)


def stream(path, body, tenant, headers=None):
    """Streams one request; (ttft_s, prompt_tokens, cached_tokens) from its SSE events."""
    t0 = time.perf_counter()
    ttft, prompt, cached = None, 0, 0
    with urllib.request.urlopen(request(path, body, tenant, headers), timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if ttft is None and (ev.get("choices") and ev["choices"][0].get("delta", {}).get("content")
                                 or ev.get("type") == "content_block_delta"):
                ttft = time.perf_counter() - t0
            u = ev.get("usage") or (ev.get("message") or {}).get("usage")
            if u and "prompt_tokens" in u:  # OpenAI
                prompt, cached = u["prompt_tokens"], u.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            elif u and "input_tokens" in u:  # Anthropic: input excludes cache reads/writes; message_delta's usage is the final one
                read, made = u.get("cache_read_input_tokens") or 0, u.get("cache_creation_input_tokens") or 0
                prompt, cached = u["input_tokens"] + read + made, read
    return (ttft if ttft is not None else time.perf_counter() - t0), prompt, cached


def body_for(dialect, user, k, cache_id=None):
    q = question(user, k)
    if dialect == "anthropic":
        return "/v1/messages", {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
                                "system": [{"type": "text", "text": HEAD + "\n" + document(user),
                                            "cache_control": {"type": "ephemeral"}}],
                                "messages": [{"role": "user", "content": q}]}
    b = {"max_tokens": MAX_TOKENS, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    if dialect == "explicit":
        b.update(cache_id=cache_id, messages=[{"role": "user", "content": q}])
    else:
        b["messages"] = [{"role": "system", "content": HEAD + "\n" + document(user)}, {"role": "user", "content": q}]
    if dialect == "key":
        b["prompt_cache_key"] = f"user-{user}"
    return "/v1/chat/completions", b


def run(dialect, tenant):
    results, errors, creation = [], [], []
    for user in range(USERS):
        cache_id = None
        if dialect == "explicit":
            t0 = time.perf_counter()
            req = request("/v1/caches", {"messages": [{"role": "system", "content": HEAD + "\n" + document(user)}], "ttl": "10m"}, tenant)
            with urllib.request.urlopen(req, timeout=600) as r:
                c = json.loads(r.read())
            creation.append((time.perf_counter() - t0, c["usage"]["total_tokens"]))
            cache_id = c["id"]
        threads, lock = [], threading.Lock()

        def one(k):
            path, b = body_for(dialect, user, k, cache_id)
            try:
                res = stream(path, b, tenant)
                with lock:
                    results.append(res)
            except Exception as e:  # reported, never silently dropped
                with lock:
                    errors.append(repr(e))
        for k in range(BURST):
            t = threading.Thread(target=one, args=(k,))
            t.start()
            threads.append(t)
            time.sleep(GAP)
        for t in threads:
            t.join()
    return results, errors, creation


def has_messages():
    try:
        urllib.request.urlopen(request("/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}, "probe"),
                               timeout=30)
    except urllib.error.HTTPError as e:
        return e.code != 404
    except Exception:
        return False
    return True


def main():
    dialects = ["plain", "key", "explicit"] + (["anthropic"] if has_messages() else [])
    if os.environ.get("DIALECTS"):  # a subset, e.g. DIALECTS="plain key"
        dialects = [d for d in dialects if d in os.environ["DIALECTS"].split()]
    print(f"workload: {USERS} users x {BURST} questions {GAP}s apart, document {DOC_WORDS} words, max_tokens {MAX_TOKENS}, seed {SEED}")
    print("| dialect | requests | prompt tokens | cached tokens | hit rate | TTFT median s | TTFT p90 s | TTFT mean s |")
    print("|---|---|---|---|---|---|---|---|")
    base = None
    for d in dialects:
        res, errs, creation = run(d, f"bench-{d}-{SEED}-{int(time.time())}")
        if errs:
            print(f"| {d} | {len(res)} ok, {len(errs)} failed: {errs[0][:120]} | | | | | | |")
            continue
        ttfts = sorted(r[0] for r in res)
        prompt, cached = sum(r[1] for r in res), sum(r[2] for r in res)
        p90 = ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))]
        med = statistics.median(ttfts)
        base = base or med
        print(f"| {d} | {len(res)} | {prompt} | {cached} | {cached / max(prompt, 1):.3f} | {med:.3f} ({med / base:.2f}x) | {p90:.3f} | {statistics.mean(ttfts):.3f} |")
        if creation:
            print(f"|   (explicit: {len(creation)} cache creations, {sum(c[1] for c in creation)} tokens prefilled, "
                  f"{statistics.mean(c[0] for c in creation):.3f} s each) | | | | | | | |")
    if "anthropic" not in dialects:
        print("anthropic: skipped (this server has no /v1/messages)")


if __name__ == "__main__":
    main()
