#!/usr/bin/env python3
"""Writes a two-tenant trace for `braid sim --tenants` (issue 37): tenant A floods one instance with
long requests, tenant B sends small ones, the shape of bench/fair_share.py's live run.

  A: --a-requests requests, one every --a-every s from t = 0 (--a-prompt prompt tokens, --a-output
     output tokens): more than the instance serves, so A always has work queued;
  B: --b-requests requests, one every --b-every s from t = --b-start (--b-prompt, --b-output).
Every prompt is distinct (no cached prefixes: "blocks" is empty). Weights with --a-weight/--b-weight.

  bench/fair_share_trace.py > /tmp/fair.jsonl
  braid sim --tenants --trace /tmp/fair.jsonl --kv-tokens 65536
"""
import argparse
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a-requests", type=int, default=60)
    ap.add_argument("--a-every", type=float, default=2.0)
    ap.add_argument("--a-prompt", type=int, default=900)
    ap.add_argument("--a-output", type=int, default=100)
    ap.add_argument("--b-requests", type=int, default=30)
    ap.add_argument("--b-every", type=float, default=3.0)
    ap.add_argument("--b-start", type=float, default=10.0)
    ap.add_argument("--b-prompt", type=int, default=15)
    ap.add_argument("--b-output", type=int, default=8)
    ap.add_argument("--a-weight", type=float, default=1.0)
    ap.add_argument("--b-weight", type=float, default=1.0)
    args = ap.parse_args()
    lines = []
    for i in range(args.a_requests):
        lines.append((i * args.a_every, "A", i, args.a_prompt, args.a_output, args.a_weight))
    for i in range(args.b_requests):
        lines.append((args.b_start + i * args.b_every, "B", i, args.b_prompt, args.b_output, args.b_weight))
    lines.sort(key=lambda x: (x[0], x[1]))
    for seq, (t, tenant, i, prompt, output, weight) in enumerate(lines):
        json.dump({"type": "request", "seq": seq, "t": round(t, 6), "id": f"{tenant.lower()}{i}", "tenant": tenant,
                   "prompt_tokens": prompt, "output_tokens": output, "block_size": 16, "blocks": [], "weight": weight},
                  sys.stdout)
        sys.stdout.write("\n")


if __name__ == "__main__":
    main()
