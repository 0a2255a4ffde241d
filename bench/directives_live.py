#!/usr/bin/env python3
"""Live cache-directive benchmarks against a running `braid serve` (bench/directives_live.sh).

    directives_live.py latency URL [REPS]    splice of a ~1K-token span in a ~8K-token context vs re-prefill
    directives_live.py pressure URL [N]      pins under pool pressure from many tenants at once

latency: per repetition and arm a fresh ~8K-token context C (its own text, so no arm sees another's
cache). The measured request (max_tokens 1, so its latency is the prefill) sends C with a splice
that replaces tokens [3500, 4500) with ~1K new tokens: `full` with nothing cached (a full re-prefill
of the edited prompt), `forget` with C cached (the prefix before the edit hits, everything after is
recomputed: what a prefix cache does with the edited text), `amortize` with C cached (only the
replacement is computed; the ~3.5K tokens after it are rotated). Reported: median latency per arm,
its speed-up over `full`, prompt tokens computed.
pressure: N concurrent clients in 8 tenants send distinct long prompts with pins (ttl 1-10 min) to a
small pool; every request must get a 200, and the outcomes (accepted / clipped / rejected) and the
unpin-for-admission count are reported with the /metrics gauges.
"""
import concurrent.futures as cf
import json
import statistics
import sys
import time
import urllib.error
import urllib.request


def post(url, body, timeout=900):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read()), time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), time.monotonic() - t0


def tokenize_count(url, text):
    _, r, _ = post(url, {"prompt": text, "max_tokens": 1, "tenant": "count"})
    return r["usage"]["prompt_tokens"]


def context_text(seed, sentences):
    return " ".join(f"Note {seed}-{i}: the shipment {i * 37 % 1000} for depot {seed} left on day {i % 28 + 1} with {i * 13 % 97} crates." for i in range(sentences))


def computed(r):
    d = r["usage"]["prompt_tokens_details"]
    return r["usage"]["prompt_tokens"] - d["cached_tokens"] - d["segment_reused_tokens"]


def latency(url, reps):
    reps = min(reps, 3)
    _, probe, _ = post(url, {"prompt": context_text(9, 40), "max_tokens": 1, "tenant": "probe"})
    sentences = int(7400 / (probe["usage"]["prompt_tokens"] / 40))  # ~7.4K tokens, room for the edit's growth
    arms = ["full", "forget", "amortize"]
    times = {a: [] for a in arms}
    work = {a: [] for a in arms}
    replacement = " ".join(f"Correction {k}: depot totals were recounted and {k * 11 % 90} crates were moved." for k in range(58))
    for rep in range(reps):
        for ai, arm in enumerate(arms):
            seed = 1 + 3 * rep + ai  # one digit for up to three repetitions: every context tokenizes alike
            text = context_text(seed, sentences)
            tenant = f"lat{seed}"
            if arm != "full":  # C cached first, as a conversation's context is
                st, primed, _ = post(url, {"prompt": text, "max_tokens": 1, "tenant": tenant})
                assert st == 200, primed
            mode = "forget" if arm == "full" else arm
            body = {"prompt": text, "max_tokens": 1, "tenant": tenant,
                    "directives": [{"op": "splice", "span": [3500, 4500], "replacement": replacement, "mode": mode}]}
            st, r, secs = post(url, body)
            assert st == 200, r
            times[arm].append(secs)
            work[arm].append(computed(r))
            print(f"[latency] rep {rep} {arm}: {secs:.2f} s, {computed(r)} of {r['usage']['prompt_tokens']} prompt tokens computed",
                  file=sys.stderr, flush=True)
    base = statistics.median(times["full"])
    print("| arm | median latency s | speed-up vs full re-prefill | prompt tokens computed (median) |")
    print("|---|---:|---:|---:|")
    for a in arms:
        m = statistics.median(times[a])
        print(f"| {a} | {m:.2f} | {base / m:.2f}x | {int(statistics.median(work[a]))} |")


def pressure(url, n):
    def client(i):
        tenant = f"p{i % 8}"
        text = context_text(50000 + i, 60)
        ttl = f"{1 + i % 10}m"
        return post(url, {"prompt": text, "max_tokens": 8, "tenant": tenant, "directives": [{"op": "pin", "ttl": ttl}]}, timeout=1800)
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(max_workers=16) as pool:
        results = list(pool.map(client, range(n)))
    statuses = {}
    outcomes = {}
    for st, r, _ in results:
        statuses[st] = statuses.get(st, 0) + 1
        for o in r.get("directive_outcomes", []):
            outcomes[o["outcome"]] = outcomes.get(o["outcome"], 0) + 1
    time.sleep(2.5)
    metrics = urllib.request.urlopen(url + "/metrics").read().decode()
    keep = [l for l in metrics.splitlines() if l.startswith(("braid_kv_pinned_blocks ", "braid_kv_pins_total", "braid_kv_pin_released",
                                                             "braid_kv_blocks_total", "braid_instance_kv_blocks_total"))]
    print(f"pressure: {n} requests from 8 tenants in {time.monotonic() - t0:.0f} s; HTTP statuses {statuses}; pin outcomes {outcomes}")
    for l in keep:
        print("    " + l)
    if set(statuses) != {200}:
        sys.exit("some request did not get a 200")


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    if sys.argv[1] == "latency":
        latency(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 3)
    elif sys.argv[1] == "pressure":
        pressure(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 64)
    else:
        sys.exit(__doc__)
