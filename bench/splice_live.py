#!/usr/bin/env python3
"""splice_live.py — a span of a long cached conversation replaced (issue 34 suite stage g):
an amortized splice (only the replacement is computed; the tokens after it are rotated copies)
against recomputing from the edit (`forget`, exact) and against a full re-prefill of the edited
prompt (nothing cached), on a running Braid server. Default sizes: an 8K-token context with a
1K-token span in its middle replaced by new 1K-token text.

Each round uses its own conversation (a round number in every sentence, so rounds share no
cache): warm-up request (the conversation as cached), then the three arms, each timed from
request to the complete one-token answer (≈ TTFT). The full re-prefill's prompt starts with a
per-round nonce, so no prefix of it is cached. Prints one JSON line per round and arm, then a
table of medians and the ratios re-prefill / splice and forget / splice.

  python3 bench/splice_live.py --url http://127.0.0.1:8000 [--model M] [--context-tokens 8192]
                               [--span-tokens 1024] [--rounds 3] [--json-out FILE]
Standard library only.
"""
import argparse
import json
import statistics
import sys
import time
import urllib.error
import urllib.request



def sentence(round_no, i, variant):
    subject = "The lighthouse keeper" if variant == "base" else "The harbour pilot"
    return (f"{subject} wrote entry {round_no}-{i}: wind from the west at {(i * 7) % 31} knots, "
            f"lamp checked {i % 5} times. ")


def build(round_no, context_tokens, span_tokens, tokens_per_sentence):
    n = max(4, int(context_tokens / tokens_per_sentence))
    k = max(1, int(span_tokens / tokens_per_sentence))
    first = (n - k) // 2
    base = [sentence(round_no, i, "base") for i in range(n)]
    span = "".join(base[first:first + k])
    replacement = "".join(sentence(round_no, i, "edit") for i in range(first, first + k))
    return "".join(base), span, replacement


def post(url, body, timeout):
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            doc = json.load(r)
    except urllib.error.HTTPError as e:
        raise SystemExit(f"splice_live: HTTP {e.code}: {e.read().decode(errors='replace')[:300]}")
    return time.monotonic() - t0, doc


def request(args, text, directives=None):
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "temperature": 0}
    if args.model:
        body["model"] = args.model
    if directives:
        body["directives"] = directives
    return post(args.url, body, args.timeout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default="")
    ap.add_argument("--context-tokens", type=int, default=8192)
    ap.add_argument("--span-tokens", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()

    # Sizing: the tokenizer's count per sentence, from two probe prompts of 8 and 24 sentences
    # (their difference cancels the chat template's tokens).
    counts = []
    for n in (8, 24):
        _, doc = request(args, "".join(sentence(0, i, "base") for i in range(n)))
        counts.append(doc["usage"]["prompt_tokens"])
    tokens_per_sentence = (counts[1] - counts[0]) / 16.0
    print(json.dumps({"bench": "splice_live_sizing", "tokens_per_sentence": tokens_per_sentence}), flush=True)
    rows = []
    for rnd in range(1, args.rounds + 1):
        text, span, replacement = build(rnd, args.context_tokens, args.span_tokens, tokens_per_sentence)
        edited = text.replace(span, replacement, 1)
        warm_s, warm = request(args, text)
        arms = [
            ("splice_amortize", text, [{"op": "splice", "span": {"match": span}, "replacement": replacement, "mode": "amortize"}]),
            ("splice_forget", text, [{"op": "splice", "span": {"match": span}, "replacement": replacement, "mode": "forget"}]),
            ("reprefill", f"[nonce {rnd}-{time.time_ns()}] " + edited, None),
        ]
        for name, prompt, directives in arms:
            secs, doc = request(args, prompt, directives)
            usage = doc.get("usage", {})
            outcomes = doc.get("directive_outcomes", [])
            if directives and (not outcomes or outcomes[0].get("outcome") != "accepted"):
                raise SystemExit(f"splice_live: round {rnd} {name}: directive not accepted: {outcomes}")
            row = {"bench": "splice_live", "round": rnd, "arm": name, "seconds": round(secs, 4),
                   "warm_seconds": round(warm_s, 4), "prompt_tokens": usage.get("prompt_tokens"),
                   "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", usage.get("cached_tokens")),
                   "segment_reused_tokens": (usage.get("prompt_tokens_details") or {}).get("segment_reused_tokens"),
                   "recomputed_tokens": outcomes[0].get("recomputed_tokens") if outcomes else None,
                   "rotated_tokens": outcomes[0].get("rotated_tokens") if outcomes else None}
            rows.append(row)
            print(json.dumps(row), flush=True)
    med = {a: statistics.median(r["seconds"] for r in rows if r["arm"] == a) for a in ("splice_amortize", "splice_forget", "reprefill")}
    summary = {"bench": "splice_live_summary", "context_tokens": args.context_tokens, "span_tokens": args.span_tokens,
               "rounds": args.rounds, "splice_s": med["splice_amortize"], "forget_s": med["splice_forget"],
               "reprefill_s": med["reprefill"], "reprefill_over_splice": med["reprefill"] / med["splice_amortize"],
               "forget_over_splice": med["splice_forget"] / med["splice_amortize"]}
    print(json.dumps(summary), flush=True)
    print(f"| arm | median s (of {args.rounds}) |\n|---|---:|", file=sys.stderr)
    for a, v in med.items():
        print(f"| {a} | {v:.3f} |", file=sys.stderr)
    print(f"re-prefill / splice {summary['reprefill_over_splice']:.2f}x, forget / splice {summary['forget_over_splice']:.2f}x",
          file=sys.stderr)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
