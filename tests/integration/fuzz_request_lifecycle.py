#!/usr/bin/env python3
"""Stateful fuzzer of the request lifecycle (issue 37): drives a running cluster with random
request sequences and checks that every request ends with an HTTP answer within a bound and that
the server's gauges return to zero. The parser fuzzers cannot find this class (a request accepted,
then never answered).

Each worker thread loops until --duration: it picks a tenant (an API key), a prompt (random token
ids, or text, often one of a few shared prefixes so that the cache holds state), and a random
shape: plain, streamed, n > 1, with stop strings, with cache directives over the prompt (splices
of random spans and replacements, including ones that empty the prompt, pins, evicts, forgets,
matches that may not exist), a workflow id and agent, a workflow end (its own id, another's, a
malformed one), or a client that disconnects early (a cancel). It also drives the explicit caches
(/v1/caches: create with good and bad bodies and TTLs, list, get, PATCH, DELETE, and completions that
name live, deleted or made-up cache ids), `unpin` directives, and, given --adapter PATH and an admin
key, runtime adapters (load and unload of a few names, good and missing files, and requests naming
them while they come and go). Every answer must come within
--bound seconds and be JSON (or an SSE stream) with a 2xx/4xx/429/5xx status; a connection
dropped by the server, a hang, or a non-JSON error is a failure. At the end braid_requests_inflight
must return to 0 and /health must answer.

  fuzz_request_lifecycle.py URL KEY[,KEY...] [--duration S] [--threads N] [--seed S] [--bound S]
                            [--admin-key KEY --adapter PATH]
Exit 0 when nothing failed; prints the seed and each failure (with the request that caused it).
"""
import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time
import urllib.parse

WORDS = "the cache holds prompt heads of every tenant while agents call tools and plan steps".split()
PREFIXES = ["You are a careful assistant. Answer in one short sentence.",
            "System: the following is a transcript of a planning session between agents.",
            "Recipe notes: bread, soup, pasta, salad, curry, stew and pie for four people."]


class Fuzzer:
    ADAPTER_NAMES = ["fz-a", "fz-b"]

    def __init__(self, url, keys, seed, bound, admin_key=None, adapter=None):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.keys, self.seed, self.bound = keys, seed, bound
        self.admin_key, self.adapter = admin_key, adapter
        self.lock = threading.Lock()
        self.failures, self.counts, self.kinds = [], {}, {}
        self.cache_ids = []  # ids the server gave out (some deleted or expired since): requests name them

    def fail(self, what, body):
        with self.lock:
            self.failures.append(f"{what}: {json.dumps(body)[:300]}")

    def count(self, status, kind):
        with self.lock:
            self.counts[status] = self.counts.get(status, 0) + 1
            self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def request(self, method, path, key, body, disconnect_after=None):
        """Sends one request; returns (status, text) or None when this client hung up on purpose."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.bound)
        headers = {"Content-Type": "application/json", "Authorization": "Bearer " + key}
        data = json.dumps(body) if body is not None else ""
        try:
            conn.request(method, path, data, headers)
            if disconnect_after is not None:
                time.sleep(disconnect_after)
                conn.sock.shutdown(socket.SHUT_RDWR)
                conn.close()
                return None
            r = conn.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            conn.close()

    def body(self, rng):
        if rng.random() < 0.5:
            prompt = rng.choice(PREFIXES) + " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 40)))
            n_tokens = None
        else:
            n = rng.randint(1, 60)
            prompt = [rng.randint(0, 49151) for _ in range(n)]
            n_tokens = n
        b = {"prompt": prompt, "max_tokens": rng.randint(1, 12), "temperature": rng.choice([0, 0.7, 1.0])}
        if rng.random() < 0.1 and n_tokens is None:
            b["cache_id"] = self.some_cache_id(rng)
        if rng.random() < 0.1 and self.adapter:
            b["model"] = rng.choice(self.ADAPTER_NAMES + ["fz-never-loaded"])
        shape = rng.random()
        if shape < 0.15:
            b["stream"] = True
        elif shape < 0.25:
            b["n"] = rng.randint(2, 3)
        elif shape < 0.32:
            b["stop"] = [rng.choice(WORDS)]
        if rng.random() < 0.3:
            b["workflow_id"] = f"wf{rng.randint(0, 5)}"
            b["agent"] = rng.choice(["planner", "coder", "tester"])
        if rng.random() < 0.35:
            b["directives"] = [self.directive(rng, prompt, n_tokens) for _ in range(rng.randint(1, 2))]
        return b

    def directive(self, rng, prompt, n_tokens):
        op = rng.choice(["splice", "splice", "pin", "evict", "forget", "unpin"])
        if op == "splice":
            if rng.random() < 0.15:  # the whole prompt away: what hung requests for ever before issue 37
                return {"op": "splice", "span": [0, n_tokens] if n_tokens is not None else {"match": prompt}, "replacement": ""}
            if n_tokens is not None or rng.random() < 0.5:
                n = n_tokens if n_tokens is not None else 8
                a = rng.randint(0, n)
                span = [a, rng.randint(a, n + 2)]
            else:
                words = prompt.split()
                i = rng.randint(0, max(0, len(words) - 1))
                span = {"match": " ".join(words[i:i + rng.randint(1, 3)]) if rng.random() < 0.8 else prompt}
            d = {"op": "splice", "span": span, "replacement": rng.choice(["", "x", " and more", "plan"])}
            if rng.random() < 0.3:
                d["mode"] = "forget"
            return d
        if op == "pin":
            return {"op": "pin", "ttl": rng.choice(["5s", "1m", "0s", "bad"])}
        if op == "unpin" and rng.random() < 0.5:
            n = n_tokens if n_tokens is not None else 8
            return {"op": "unpin", "span": rng.choice([[0, n], [rng.randint(0, n), n + 3], [5, 2], "all"])}
        return {"op": op}

    def some_cache_id(self, rng):
        with self.lock:
            known = list(self.cache_ids)
        if known and rng.random() < 0.8:
            return rng.choice(known)
        return rng.choice(["cache_0000", "cache_" + "f" * 32, "", "../x", 7])

    def cache_call(self, rng):
        """One /v1/caches call: (method, path, body)."""
        roll = rng.random()
        if roll < 0.35:
            body = {"prompt": rng.choice(PREFIXES) + " " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 30))),
                    "ttl": rng.choice(["5s", "1m", "1h", 3, "0s", "25h", "soon", None])}
            if rng.random() < 0.1:
                body = rng.choice([{}, {"prompt": ""}, {"messages": "not a list"}, {"prompt": "x", "messages": []}, []])
            elif rng.random() < 0.2:
                body = {"messages": [{"role": "system", "content": rng.choice(PREFIXES)}], "ttl": "1m"}
            return "POST", "/v1/caches", body
        if roll < 0.5:
            return "GET", "/v1/caches", None
        cid = self.some_cache_id(rng)
        path = f"/v1/caches/{urllib.parse.quote(str(cid))}"
        if roll < 0.65:
            return "GET", path, None
        if roll < 0.82:
            return "PATCH", path, {"ttl": rng.choice(["10s", "2m", "bad", 0, None])}
        return "DELETE", path, None

    def adapter_call(self, rng):
        """One runtime-adapter call (admin key): (method, path, body)."""
        name = rng.choice(self.ADAPTER_NAMES + [""])
        if rng.random() < 0.55:
            path = rng.choice([self.adapter] * 4 + ["/nonexistent/adapter.gguf", __file__])
            return "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path}
        return "POST", "/v1/unload_lora_adapter", {"lora_name": name}

    def remember_cache(self, method, path, status, text):
        if method == "POST" and path == "/v1/caches" and status == 200:
            try:
                cid = json.loads(text)["id"]
            except (ValueError, KeyError, TypeError):
                return
            with self.lock:
                self.cache_ids.append(cid)
                del self.cache_ids[:-32]

    def one(self, rng):
        key = rng.choice(self.keys)
        roll = rng.random()
        method = "POST"
        if roll < 0.08:
            wf = rng.choice(["wf1", "wf2", "%FF", "a%0D%0Ab", "x" * rng.choice([10, 300])])
            path, body = f"/v1/workflows/{wf}/end", None
        elif roll < 0.16:
            method, path, body = self.cache_call(rng)
        elif roll < 0.19 and self.adapter and self.admin_key:
            key = self.admin_key
            method, path, body = self.adapter_call(rng)
        else:
            path, body = "/v1/completions", self.body(rng)
        disconnect = rng.uniform(0, 0.5) if roll > 0.9 and path == "/v1/completions" else None
        t0 = time.monotonic()
        try:
            got = self.request(method, path, key, body, disconnect)
        except (socket.timeout, TimeoutError):
            self.fail(f"no answer within {self.bound} s ({path})", body)
            return
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            self.fail(f"connection dropped by the server ({type(e).__name__}: {e}) on {path}", body)
            return
        kind = f"{method} {path.split('/')[2] if path.count('/') > 1 else path}"
        if got is None:
            self.count("disconnect", kind)
            return
        status, text = got
        self.count(status, kind)
        self.remember_cache(method, path, status, text)
        if time.monotonic() - t0 > self.bound:
            self.fail(f"answer after {time.monotonic() - t0:.1f} s", body)
        if status >= 500 and status != 503:
            self.fail(f"status {status}: {text[:200]}", body)
        if isinstance(body, dict) and body.get("stream") and status == 200:
            if "[DONE]" not in text:
                self.fail("stream without [DONE]", body)
            return
        if status == 200 and "lora_adapter" in path:
            return  # vLLM's answer to a load or unload is plain text ("Success: LoRA adapter ...")
        try:
            json.loads(text)
        except ValueError:
            self.fail(f"status {status} answer is not JSON: {text[:120]!r}", body)

    def worker(self, index, deadline):
        rng = random.Random(self.seed * 1000 + index)
        while time.monotonic() < deadline:
            self.one(rng)

    def metric(self, name):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            conn.request("GET", "/metrics", headers={"Authorization": "Bearer " + self.keys[0]})
            for line in conn.getresponse().read().decode().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == name:
                    return float(parts[1])
        finally:
            conn.close()
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("keys")
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--bound", type=float, default=120)
    ap.add_argument("--admin-key", help="a key with `admin` in the key file: runtime adapter calls")
    ap.add_argument("--adapter", help="a LoRA adapter file the runtime loads use")
    args = ap.parse_args()
    f = Fuzzer(args.url, args.keys.split(","), args.seed, args.bound, args.admin_key, args.adapter)
    print(f"fuzz_request_lifecycle: seed {args.seed}, {args.threads} threads, {args.duration:.0f} s", flush=True)
    deadline = time.monotonic() + args.duration
    threads = [threading.Thread(target=f.worker, args=(i, deadline)) for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    inflight = None
    for _ in range(100):  # cancelled and disconnected requests finish on the instance shortly
        inflight = f.metric("braid_requests_inflight")
        if inflight == 0:
            break
        time.sleep(0.2)
    if inflight != 0:
        f.failures.append(f"braid_requests_inflight is {inflight} after every request ended")
    print("answers by status:", json.dumps({str(k): v for k, v in sorted(f.counts.items(), key=lambda kv: str(kv[0]))}))
    print("calls by endpoint:", json.dumps(dict(sorted(f.kinds.items()))))
    for x in f.failures:
        print("FAIL", x)
    print(f"fuzz_request_lifecycle: {len(f.failures)} failure(s), seed {args.seed}")
    sys.exit(1 if f.failures else 0)


if __name__ == "__main__":
    main()
