#!/usr/bin/env python3
"""Integration test of issue 22's points 3, 7 and 8 against a real 1 + 1x1-rank cluster.

    tests/integration/test_api_features.py BRAID_BINARY MODEL

Point 3: logprobs / top_logprobs for chat and completions, whole and streamed, from the raw model
distribution (a temperature changes the sampled tokens, never the first token's reported
distribution); n > 1 (own index and finish_reason per choice, usage summing completion tokens,
seed + i reproducible, the prompt's KV computed once: the siblings' prompt blocks are cache hits);
prompts as a list of strings, token ids and lists of token ids (ids outside the vocabulary: 400);
fields Braid does not honour (penalties, unknown) and malformed tools / tool_choice / response_format
are a 400 naming the field. With the openai package installed (scripts/test.sh's .venv-test), the
official client reads logprobs and n > 1 too.
Point 7: 1100 connections that send half a request line and stop do not lock anyone out: /health
answers within 2 s, a completion succeeds, and the server closes the flood's surplus connections;
the short idle timeout (--http-timeout 1) never cuts an answer the server is slow to produce.
Point 8: a garbage request line gets a JSON 400 (raw socket); so does broken framing (a malformed or
disagreeing Content-Length, an unknown Transfer-Encoding: 400/501), and a body announced over the
limit with Expect: 100-continue gets its 413 at once, unread.
Exit status: 0 when every check passed.
"""
import json
import math
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

BRAID, MODEL = os.path.realpath(sys.argv[1]), os.path.realpath(sys.argv[2])
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
failures = 0


def check(what, ok):
    global failures
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        failures += 1
    return ok


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from free_port import free_port  # noqa: E402  (a port no MPI rank of the job can take first)

PORT = free_port()
URL = f"http://127.0.0.1:{PORT}"


def post(path, body, timeout=120):
    """(status, parsed JSON body) of a POST."""
    req = urllib.request.Request(URL + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def stream(path, body):
    """The parsed data events of a streamed POST (without [DONE])."""
    req = urllib.request.Request(URL + path, data=json.dumps(dict(body, stream=True)).encode(),
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=600) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


def metric(name):
    text = urllib.request.urlopen(URL + "/metrics", timeout=10).read().decode()
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Name three colours."}]


# ---------------------------------------------------------------- point 3: logprobs

def check_chat_logprobs():
    status, r = post(CHAT, {"messages": HELLO, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3})
    content = r["choices"][0]["logprobs"]["content"] if status == 200 else []
    check(f"chat logprobs: one entry per completion token ({len(content)} vs {r.get('usage', {}).get('completion_tokens')})",
          status == 200 and len(content) == r["usage"]["completion_tokens"] > 0)
    check("chat logprobs: the entries' text is the message", "".join(e["token"] for e in content) == r["choices"][0]["message"]["content"])
    check("chat logprobs: bytes are each token's UTF-8", all(bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] for e in content))
    check("chat logprobs: 3 alternatives each, most likely first, all <= 0",
          all(len(e["top_logprobs"]) == 3 and e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][2]["logprob"] and e["logprob"] <= 0
              for e in content))
    check("chat logprobs: greedy picks the most likely token, with its logprob",
          all(e["token"] == e["top_logprobs"][0]["token"] and abs(e["logprob"] - e["top_logprobs"][0]["logprob"]) < 1e-6 for e in content))
    check("chat logprobs: alternatives' probabilities sum to at most 1",
          all(sum(math.exp(t["logprob"]) for t in e["top_logprobs"]) <= 1.0 + 1e-4 for e in content))
    # Raw model distribution: a temperature changes the draw, never the first token's reported
    # distribution. Both requests below hit the prompt's cached blocks, so their logits are computed
    # alike (a cache hit recomputes only the last block, which moves logprobs by ~1e-3).
    first = {}
    for temperature in (0, 1.8):
        _, r1 = post(CHAT, {"messages": HELLO, "max_tokens": 1, "temperature": temperature, "seed": 3, "logprobs": True,
                            "top_logprobs": 3})
        first[temperature] = [(t["token"], t["logprob"]) for t in r1["choices"][0]["logprobs"]["content"][0]["top_logprobs"]]
    check(f"logprobs are of the raw distribution: the same at temperature 0 and 1.8 ({first[1.8]})", first[0] == first[1.8])
    _, none = post(CHAT, {"messages": HELLO, "max_tokens": 2})
    check("no logprobs asked: logprobs is null", none["choices"][0]["logprobs"] is None)
    events = stream(CHAT, {"messages": HELLO, "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 3})
    streamed = [e for ev in events for c in ev["choices"] if c.get("logprobs") for e in c["logprobs"]["content"]]
    check("streamed chat logprobs equal the whole answer's (within a cache hit's rounding)",
          [e["token"] for e in streamed] == [e["token"] for e in content] and
          all(abs(a["logprob"] - b["logprob"]) < 2e-2 for a, b in zip(streamed, content)))


def check_completion_logprobs():
    status, r = post(COMPLETIONS, {"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0, "logprobs": 2})
    lp = r["choices"][0]["logprobs"] if status == 200 else {}
    text = r["choices"][0]["text"] if status == 200 else None
    check("completion logprobs: tokens spell the text", status == 200 and "".join(lp["tokens"]) == text)
    offsets = [0]
    for t in lp.get("tokens", [])[:-1]:
        offsets.append(offsets[-1] + len(t.encode()))
    check("completion logprobs: text_offset is each token's start", lp.get("text_offset") == offsets)
    check("completion logprobs: token_logprobs and 2 top alternatives per token",
          len(lp.get("token_logprobs", [])) == len(lp.get("tokens", [])) and all(len(t) == 2 for t in lp.get("top_logprobs", [])))
    check("completion logprobs: greedy token is its top alternative",
          all(max(top, key=top.get) == tok for tok, top in zip(lp.get("tokens", []), lp.get("top_logprobs", []))))
    events = stream(COMPLETIONS, {"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0, "logprobs": 2})
    streamed = [t for ev in events for c in ev["choices"] if c.get("logprobs") for t in c["logprobs"]["tokens"]]
    check("streamed completion logprobs list the same tokens", streamed == lp.get("tokens"))


# ---------------------------------------------------------------- point 3: n > 1 and prompts

LONG_PROMPT = "Once upon a time, in a village by the sea, there lived an old fisherman and his three daughters. " * 4


def check_n():
    cached_before = metric('braid_prompt_tokens_cached_total{tier="device"}') or 0
    body = {"prompt": LONG_PROMPT, "max_tokens": 8, "temperature": 1.0, "n": 4, "seed": 11}
    status, r = post(COMPLETIONS, body)
    choices = r.get("choices", [])
    check("n = 4: four choices, indices 0..3, each with a finish_reason",
          status == 200 and sorted(c["index"] for c in choices) == [0, 1, 2, 3] and all(c["finish_reason"] for c in choices))
    check("n = 4: usage sums the choices' completion tokens (4 x 8)", r.get("usage", {}).get("completion_tokens") == 32)
    check("n = 4: usage counts the prompt once", r.get("usage", {}).get("prompt_tokens", 0) < 200)
    check("n = 4: the choices differ (seed + i each)", len({c["text"] for c in choices}) > 1)
    cached = (metric('braid_prompt_tokens_cached_total{tier="device"}') or 0) - cached_before
    prompt_tokens = r.get("usage", {}).get("prompt_tokens", 0)
    full_blocks = (prompt_tokens - 1) // 16 * 16
    check(f"n = 4: the prompt's KV is computed once (siblings hit the cache: {cached:.0f} >= 3 x {full_blocks} tokens)",
          full_blocks > 0 and cached >= 3 * full_blocks)
    _, again = post(COMPLETIONS, body)
    check("n = 4 with a seed reproduces every choice",
          [c["text"] for c in sorted(choices, key=lambda c: c["index"])] ==
          [c["text"] for c in sorted(again.get("choices", []), key=lambda c: c["index"])])
    events = stream(CHAT, {"messages": HELLO, "max_tokens": 4, "n": 2, "stream_options": {"include_usage": True}})
    finished = {c["index"] for ev in events for c in ev["choices"] if c.get("finish_reason")}
    usage = [ev["usage"] for ev in events if ev.get("usage")]
    check("streamed n = 2: both choices finish; usage sums their tokens (2..8)",
          finished == {0, 1} and len(usage) == 1 and 2 <= usage[0]["completion_tokens"] <= 8)


def tokenize(text):
    out = subprocess.run([BRAID, "tokenize", "--model", MODEL], input=text, capture_output=True, text=True, check=True).stdout
    return [int(x) for x in out.split()]


def check_prompts():
    status, r = post(COMPLETIONS, {"prompt": ["The sky is", "Grass is"], "max_tokens": 3, "temperature": 0})
    check("a list of two prompts: two choices", status == 200 and sorted(c["index"] for c in r["choices"]) == [0, 1])
    _, one = post(COMPLETIONS, {"prompt": "Grass is", "max_tokens": 3, "temperature": 0})
    check("a list's second prompt answers as it does alone", status == 200 and r["choices"][1]["text"] == one["choices"][0]["text"])
    ids = tokenize("Grass is")
    status, by_ids = post(COMPLETIONS, {"prompt": ids, "max_tokens": 3, "temperature": 0})
    check(f"token ids {ids} answer as their text does", status == 200 and by_ids["choices"][0]["text"] == one["choices"][0]["text"])
    status, lists = post(COMPLETIONS, {"prompt": [ids, ids[1:]], "max_tokens": 3, "temperature": 0, "n": 2})
    check("a list of two token-id lists with n = 2: four choices, the first prompt's greedy answers equal",
          status == 200 and len(lists["choices"]) == 4 and lists["choices"][0]["text"] == lists["choices"][1]["text"] ==
          one["choices"][0]["text"])
    status, bad = post(COMPLETIONS, {"prompt": [1, 49152 * 4], "max_tokens": 2})
    check("a token id outside the vocabulary: 400 naming prompt",
          status == 400 and bad["error"]["param"] == "prompt" and "outside the vocabulary" in bad["error"]["message"])


def check_refused_fields():
    cases = [
        (CHAT, {"tools": [{"type": "function", "function": {"name": "bad name", "parameters": {}}}]}, "tools[0].function.name"),
        (CHAT, {"tool_choice": "required"}, "tool_choice"),
        (CHAT, {"response_format": {"type": "yaml"}}, "response_format.type"),
        (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}},
         "response_format.json_schema.schema"),
        # more alternatives at one position than the matcher follows: a 500 mid-generation before
        (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "enum": ["v%d" % i for i in range(8200)]}}}}, "response_format.json_schema.schema"),
        (CHAT, {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "anyOf": [{"enum": ["v%d_%d" % (j, i) for i in range(100)]} for j in range(100)]}}}}, "response_format.json_schema.schema"),
        (CHAT, {"frequency_penalty": 0.5}, "frequency_penalty"),
        (CHAT, {"presence_penalty": 1}, "presence_penalty"),
        (CHAT, {"logit_bias": {"42": 5}}, "logit_bias"),
        (CHAT, {"store": True}, "store"),
        (COMPLETIONS, {"echo": True}, "echo"),
        (COMPLETIONS, {"suffix": "x"}, "suffix"),
        (COMPLETIONS, {"best_of": 3}, "best_of"),
    ]
    for path, extra, field in cases:
        base = {"messages": HELLO} if path == CHAT else {"prompt": "hi"}
        status, r = post(path, dict(base, max_tokens=2, **extra))
        key = field.split(".")[0].split("[")[0]
        check(f"{key} {json.dumps(extra[key])[:40]}: 400 naming {field}",
              status == 400 and r.get("error", {}).get("param") == field)
    status, _ = post(CHAT, {"messages": HELLO, "max_tokens": 2, "response_format": {"type": "text"}, "tool_choice": "none",
                            "frequency_penalty": 0, "user": "u-1"})
    check("the no-op values (response_format text, tool_choice none, penalty 0, user) are accepted", status == 200)


def check_openai_client():
    try:
        import openai
    except ImportError:
        print("skip the openai client checks (no openai package; scripts/test.sh installs it into .venv-test)")
        return
    client = openai.OpenAI(base_url=URL + "/v1", api_key="none")
    chat = client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=3, temperature=0, logprobs=True, top_logprobs=2)
    lp = chat.choices[0].logprobs.content
    check("openai client: chat logprobs with 2 alternatives", len(lp) == chat.usage.completion_tokens and len(lp[0].top_logprobs) == 2)
    comp = client.completions.create(model=MODEL_NAME, prompt="Hello", max_tokens=3, n=2, seed=5, logprobs=1)
    check("openai client: completions n = 2 with logprobs", len(comp.choices) == 2 and comp.choices[1].logprobs.tokens)


# ---------------------------------------------------------------- points 7 and 8: the front door

HTTP_TIMEOUT = 1  # --http-timeout: the request line within 1 s, idle connections closed after 3 s
# ~3000 tokens: a prefill of several seconds on a CPU (7 s on the 2-core machine, idle); one prompt
# per check, so the second does not find the first's blocks in the cache.
SLOW_PROMPTS = {False: "word " * 3000, True: "thing " * 3000}


def check_slow_answers():
    """The short idle timeout applies to clients, never to the server's own slow work: a whole answer
    and a stream whose first token comes after a long prefill both arrive after more than 3x it."""
    idle = 3 * HTTP_TIMEOUT
    for streamed in (False, True):
        what = "a stream" if streamed else "a whole answer"
        t = time.time()
        try:
            if streamed:
                events = stream(COMPLETIONS, {"prompt": SLOW_PROMPTS[True], "max_tokens": 2, "temperature": 0})
                ok = any(c.get("finish_reason") for ev in events for c in ev["choices"])
            else:
                status, r = post(COMPLETIONS, {"prompt": SLOW_PROMPTS[False], "max_tokens": 2, "temperature": 0}, timeout=600)
                ok = status == 200 and r["usage"]["completion_tokens"] >= 1
        except OSError as e:
            ok = False
            print(f"     {what}: {e!r}")
        took = time.time() - t
        check(f"{what} after a {took:.1f} s prefill (> the {idle} s idle timeout) arrives whole", ok and took > idle)


def raw_answer(data):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
    s.sendall(data)
    got = b""
    try:
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            got += chunk
    except OSError:
        pass
    s.close()
    head, _, body = got.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode("latin1"), body


def check_garbage_line():
    for line in (b"GARBAGE\r\n\r\n", b"\x16\x03\x01\x02\x00\x01\x00\r\n\r\n", b"GET /health\r\n\r\n"):
        status, body = raw_answer(line)
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError):
            message = None
        check(f"request line {line[:12]!r}: JSON 400 ({status})", status == "HTTP/1.1 400 Bad Request" and message is not None)


def check_framing():
    """Framing libmicrohttpd 0.9.75 mishandles: a malformed Content-Length got its status line and
    headers twice (the second copy read as the body); a Transfer-Encoding it does not know, or
    Content-Length headers that disagree, got nothing until the idle timeout (30 s here: raw_answer
    gives up after 5); a body announced over --max-body-bytes by a client waiting for 100-continue was
    let in (and read) before its 413. Each is now one JSON error at once (the 413 in the endpoint's
    own dialect)."""
    cases = [
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n", "HTTP/1.1 400 Bad Request", "Content-Length"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 400 Bad Request", "Content-Length"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n{}", "HTTP/1.1 400 Bad Request", "disagree"),
        (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n{}", "HTTP/1.1 501 Not Implemented", "chunked"),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", "HTTP/1.1 413 Content Too Large",
         "larger than"),
        (b"POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
         b"Content-Length: 9000000\r\n\r\n", "HTTP/1.1 413 Content Too Large", "exceeds"),
        (b"POST /v1/messages HTTP/1.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
         b"Content-Length: 9000000\r\n\r\n", "HTTP/1.1 413 Content Too Large", "exceeds"),
    ]
    for request, status_line, says in cases:
        t = time.time()
        status, body = raw_answer(request)
        try:
            d = json.loads(body)
            message = d["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = ""
        check(f"{request.split(b'HTTP/1.1')[1][2:60]!r}...: one JSON '{status_line[9:]}' naming '{says}' in "
              f"{time.time() - t:.1f} s (got {status!r}, {body[:60]!r})", status == status_line and says in message)
    status, body = raw_answer(b"POST /v1/messages HTTP/1.1\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n"
                              b"Content-Length: 9000000\r\n\r\n")
    check("... the /v1/messages 413 is in Anthropic's shape", body.startswith(b'{"type":"error"'))
    # A client that sends its oversized body without Expect (urllib, requests, httpx) must still read
    # the 413, not a broken pipe: the server reads the body before it answers and closes.
    req = urllib.request.Request(URL + CHAT, data=b'{"x":"' + b"a" * 9000000 + b'"}', headers={"Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=60)
        got = "200"
    except urllib.error.HTTPError as e:
        got = str(e.code)
    except OSError as e:
        got = repr(e)
    check(f"a 9 MB body sent whole (no Expect) gets its 413 (got {got})", got == "413")
    status, _ = raw_answer(b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
                           b"Transfer-Encoding: chunked\r\n\r\n1e\r\n{\"prompt\":\"Hi\",\"max_tokens\":2}\r\n0\r\n\r\n")
    check(f"a chunked body is still served ({status})", status == "HTTP/1.1 200 OK")


def check_flood(n_sockets=1100):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n_sockets + 100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n_sockets + 200), hard))
    flood = []
    try:
        for _ in range(n_sockets):
            s = socket.create_connection(("127.0.0.1", PORT), timeout=5)
            s.sendall(b"POST /v1/chat/compl")  # half a request line, then silence
            flood.append(s)
        t = time.time()
        health = urllib.request.urlopen(URL + "/health", timeout=5).status
        took = time.time() - t
        check(f"{n_sockets} half-sent request lines: /health answers in {took:.2f} s", health == 200 and took < 2.0)
        t = time.time()
        metrics = urllib.request.urlopen(URL + "/metrics", timeout=5).status
        check(f"... /metrics answers in {time.time() - t:.2f} s", metrics == 200)
        status, r = post(CHAT, {"messages": HELLO, "max_tokens": 3}, timeout=60)
        check("... a completion still succeeds", status == 200 and r["choices"][0]["message"]["content"])
        closed = 0
        for s in flood:
            s.settimeout(0.05)
            try:
                data = s.recv(64)
                closed += data == b"" or data.startswith(b"HTTP/1.1 408")
            except OSError:
                pass
        check(f"... the server closed the flood's surplus ({closed} of {n_sockets} with a 408)", closed >= n_sockets - 64 - 8)
    finally:
        for s in flood:
            s.close()


# ---------------------------------------------------------------- the cluster

MODEL_NAME = os.path.basename(MODEL).removesuffix(".gguf")


def main():
    # The openai checks need the package; scripts/test.sh installs it into .venv-test.
    venv = os.path.join(ROOT, ".venv-test", "bin", "python")
    try:
        import openai  # noqa: F401
    except ImportError:
        if os.path.exists(venv) and os.path.realpath(sys.executable) != os.path.realpath(venv):
            os.execv(venv, [venv] + sys.argv)
    env = dict(os.environ, BRAID_BIN=BRAID)
    log = tempfile.TemporaryFile()
    launcher = subprocess.Popen([os.path.join(ROOT, "launch", "braid-local"), "--model", MODEL, "--port", str(PORT),
                                 "--http-timeout", str(HTTP_TIMEOUT)], env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(240):
            try:
                if urllib.request.urlopen(URL + "/health", timeout=2).status == 200:
                    break
            except OSError:
                pass
            if launcher.poll() is not None:
                break
            time.sleep(0.5)
        if not check("cluster ready", launcher.poll() is None):
            log.seek(0)
            print(log.read().decode(errors="replace"))
            return 1
        check_chat_logprobs()
        check_completion_logprobs()
        check_n()
        check_prompts()
        check_refused_fields()
        check_openai_client()
        check_garbage_line()
        check_framing()
        check_slow_answers()
        check_flood()
        status, _ = post(CHAT, {"messages": HELLO, "max_tokens": 2})
        check("the server serves after everything", status == 200)
    finally:
        os.killpg(launcher.pid, signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
