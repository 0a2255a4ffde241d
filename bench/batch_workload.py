#!/usr/bin/env python3
"""The batched-decode workload of bench/run_batch_bench.sh and bench/run_cpu_bench.sh.

    batch_workload.py requests C [MAX_TOKENS]  C distinct prompts (~130 tokens each), JSONL for `braid batch`
    batch_workload.py decode-rate RESULTS      decode-phase tok/s of a `braid batch` results file
    batch_workload.py mean-prompt RESULTS      mean prompt tokens per request (to size llama-batched-bench -npp)

Decode phase, as llama-batched-bench's S_TG: the tokens generated after every request has its
first token, over that span (each request's tokens assumed evenly paced between its first token
and its end).
"""
import json
import sys


def requests(concurrency, max_tokens):
    for i in range(concurrency):
        words = " ".join(f"item{(i * 31 + k) % 997}" for k in range(30))
        print(json.dumps({"id": f"s{i}", "prompt": f"Inventory {i}: {words}. Continue the list:",
                          "max_tokens": max_tokens, "ignore_eos": True}))


def decode_rate(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    start = max(r["ttft_ms"] for r in rows)
    toks = 0.0
    for r in rows:
        span = r["latency_ms"] - r["ttft_ms"]
        done_after = max(0.0, r["latency_ms"] - max(start, r["ttft_ms"]))
        toks += (r["completion_tokens"] - 1) * (done_after / span if span > 0 else 0)
    end = max(r["latency_ms"] for r in rows)
    return toks / ((end - start) / 1e3)


def mean_prompt(path):
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return sum(r["prompt_tokens"] for r in rows) / len(rows)


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "requests":
        requests(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 64)
    elif len(sys.argv) == 3 and sys.argv[1] == "decode-rate":
        print(f"{decode_rate(sys.argv[2]):.1f}")
    elif len(sys.argv) == 3 and sys.argv[1] == "mean-prompt":
        print(f"{mean_prompt(sys.argv[2]):.0f}")
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
