#!/usr/bin/env python3
"""Fair sharing between tenants (issue 37), live: tenant B's latency under tenant A's flood.

Starts a 1-instance cluster with API keys for tenants A and B (launch/braid-local), then:
  1. B alone: B sends --b-requests small requests one after another (short prompt, --b-tokens
     output tokens); their median latency;
  2. A's flood: --a-streams concurrent loops of A's long requests (--a-prompt-words words of
     prompt, --a-tokens output tokens) run for the whole phase, while B sends the same small
     requests as in 1; B's median latency, and the completion tokens per second of the whole
     phase (A's and B's together) as throughput.
Prints one JSON line with the figures. Run it once with --serve-args "--fair-share off" (first
come, first served) and once with the default (fair), on the same machine, and compare.

  bench/fair_share.py --braid build-rel/braid --model models/SmolLM2-135M-Instruct.Q4_1.gguf \\
      [--serve-args "--fair-share off"] [--b-requests 8] [--a-streams 4]
"""
import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from free_port import free_port  # noqa: E402

KEY_A = "sk-tenant-a-fairshare-0123456789"
KEY_B = "sk-tenant-b-fairshare-9876543210"


def post(url, key, body, timeout=600):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            out = json.loads(r.read())
            return time.monotonic() - t0, out["usage"]["completion_tokens"], r.status
    except urllib.error.HTTPError as e:
        return time.monotonic() - t0, 0, e.code


def b_request(i, tokens):
    return {"prompt": f"Question {i}: name one colour of the rainbow.", "max_tokens": tokens, "temperature": 0,
            "ignore_eos": True}


def a_request(i, words, tokens):
    text = " ".join(f"item{(i * 7 + k) % 997}" for k in range(words))
    return {"prompt": f"Summarise this list {i}: {text}", "max_tokens": tokens, "temperature": 0.7, "seed": i,
            "ignore_eos": True}


def b_phase(url, n, tokens, offset):
    lat = []
    for i in range(n):
        t, _, status = post(url, KEY_B, b_request(offset + i, tokens))
        if status != 200:
            raise SystemExit(f"B's request got {status}")
        lat.append(t)
    return lat


def stop_on_signal(signum, frame):
    raise SystemExit(f"signal {signum}")  # runs the finally that stops the cluster


def main():
    signal.signal(signal.SIGTERM, stop_on_signal)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--braid", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--serve-args", default="")
    ap.add_argument("--b-requests", type=int, default=8)
    ap.add_argument("--b-tokens", type=int, default=8)
    ap.add_argument("--a-streams", type=int, default=4)
    ap.add_argument("--a-prompt-words", type=int, default=200)
    ap.add_argument("--a-tokens", type=int, default=400)
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="fair_share.")
    keys = os.path.join(work, "keys")
    with open(keys, "w") as f:
        f.write(f"{KEY_A} tenant=A\n{KEY_B} tenant=B\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, BRAID_BIN=os.path.abspath(args.braid))
    cmd = [os.path.join(ROOT, "launch", "braid-local"), "--model", args.model, "--port", str(port), "--instances", "1",
           "--api-keys", keys] + shlex.split(args.serve_args)
    err = open(os.path.join(work, "serve.err"), "w")
    launcher = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
    try:
        for _ in range(600):
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if launcher.poll() is not None:
                raise SystemExit(f"the cluster exited; see {err.name}")
            time.sleep(0.5)
        b_phase(url, 2, args.b_tokens, 1000)  # warm-up
        alone = b_phase(url, args.b_requests, args.b_tokens, 0)

        stop = threading.Event()
        done_tokens = [0] * args.a_streams
        a_lat = [[] for _ in range(args.a_streams)]

        def flood(s):
            i = 0
            while not stop.is_set():
                t, n, status = post(url, KEY_A, a_request(s * 100000 + i, args.a_prompt_words, args.a_tokens))
                if status == 200:
                    done_tokens[s] += n
                    a_lat[s].append(t)
                i += 1

        t0 = time.monotonic()
        threads = [threading.Thread(target=flood, args=(s,), daemon=True) for s in range(args.a_streams)]
        for t in threads:
            t.start()
        time.sleep(3.0)  # A's requests are in flight
        loaded = b_phase(url, args.b_requests, args.b_tokens, 0)
        stop.set()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        total = sum(done_tokens) + args.b_requests * args.b_tokens
        print(json.dumps({
            "serve_args": args.serve_args, "b_median_alone_s": round(statistics.median(alone), 3),
            "b_median_under_flood_s": round(statistics.median(loaded), 3),
            "slowdown": round(statistics.median(loaded) / statistics.median(alone), 2),
            "a_requests": sum(len(x) for x in a_lat), "a_median_s": round(statistics.median([t for x in a_lat for t in x]), 2)
            if any(a_lat) else None,
            "phase_s": round(elapsed, 1), "completion_tokens_per_s": round(total / elapsed, 1)}))
    finally:
        try:
            launcher.send_signal(signal.SIGTERM)  # the launcher drains the cluster and stops every rank
            launcher.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(launcher.pid, signal.SIGKILL)
        err.close()


if __name__ == "__main__":
    main()
