#!/usr/bin/env python3
"""Inputs and report of bench/directives_study.sh (cache directives, issue 18).

    directives_transform.py edit-replay BATCH OUT_PREFIX MAX_TOKENS   writes OUT.in-plain/.in-amortize/.in-forget.jsonl
    directives_transform.py cross-tenant BATCH OUT_PREFIX MAX_TOKENS  writes OUT.in-plain/.in-share.jsonl
    directives_transform.py report OUT_DIR MAX_TOKENS                 the markdown tables

edit-replay: a replay call's prompt is the workflow's last build prompt with one early word
changed. Its directive form sends that build prompt (the cached context) and a splice whose span is
the changed words with a little context before them (the n-th occurrence of that text, so the
match is the edited place) and whose replacement is the same text as edited.
cross-tenant: every call also asks to share its prompt through the end of the article with all
tenants (the match is the article's last 80 characters).
"""
import base64
import json
import math
import os
import struct
import sys


def rows(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def write(path, items):
    with open(path, "w") as f:
        for r in items:
            f.write(json.dumps(r) + "\n")


def changed_span(old, new):
    p = 0
    while p < min(len(old), len(new)) and old[p] == new[p]:
        p += 1
    s = 0
    while s < min(len(old), len(new)) - p and old[len(old) - 1 - s] == new[len(new) - 1 - s]:
        s += 1
    return p, len(old) - s, len(new) - s


def splice_for(build, replay, mode, context=24):
    p, old_end, new_end = changed_span(build, replay)
    start = max(0, p - context)
    match = build[start:old_end]
    occurrence = build[: start + len(match)].count(match)  # occurrences starting at or before this one
    # count() counts non-overlapping occurrences; the edited place is the last of those that end by here
    return {"op": "splice", "span": {"match": match, "occurrence": max(1, occurrence)}, "replacement": replay[start:new_end],
            "mode": mode}


def edit_replay(batch, prefix, max_tokens):
    calls = rows(batch)
    last_build = {}
    plain, amortize, forget = [], [], []
    for r in calls:
        r["max_tokens"] = max_tokens
        r.pop("segment_reuse", None)
        plain.append(r)
        if r["agent"] == "build":
            last_build[r["workflow_id"]] = r["prompt"]
        if r["agent"] == "replay":
            build = last_build[r["workflow_id"]]
            for mode, out in (("amortize", amortize), ("forget", forget)):
                out.append(dict(r, prompt=build, directives=[splice_for(build, r["prompt"], mode)]))
        else:
            amortize.append(r)
            forget.append(r)
    write(prefix + ".in-plain.jsonl", plain)
    write(prefix + ".in-amortize.jsonl", amortize)
    write(prefix + ".in-forget.jsonl", forget)


def cross_tenant(batch, prefix, max_tokens):
    plain, share = [], []
    for r in rows(batch):
        r["max_tokens"] = max_tokens
        r.pop("segment_reuse", None)
        plain.append(r)
        end = r["prompt"].find("\n\n### Session")
        tail = r["prompt"][max(0, end - 80):end]
        share.append(dict(r, directives=[{"op": "share", "span": {"match": tail}, "with": "all"}]) if end > 0 else r)
    write(prefix + ".in-plain.jsonl", plain)
    write(prefix + ".in-share.jsonl", share)


def logits(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        raw = base64.b64decode(r["logits"])
        out[r["id"]] = struct.unpack(f"<{len(raw) // 4}f", raw)
    return out


def softmax(v):
    m = max(v)
    e = [math.exp(x - m) for x in v]
    s = sum(e)
    return [x / s for x in e]


def kl(p_logits, q_logits):
    p, q = softmax(p_logits), softmax(q_logits)
    return sum(a * (math.log(a) - math.log(max(b, 1e-30))) for a, b in zip(p, q) if a > 0)


def hit(rs):
    prompt = sum(r["prompt_tokens"] for r in rs)
    return 100.0 * sum(r["cached_tokens"] + r["segment_reused_tokens"] for r in rs) / prompt if prompt else 0.0


def report(out, max_tokens):
    """The edit-replay table (cross-tenant is measured live: bench/directives_tenants.sh)."""
    arms = [a for a in ["off", "radix", "approx", "amortize", "forget"] if os.path.exists(f"{out}/edit-replay.{a}.jsonl")]
    res = {a: {r["id"]: r for r in rows(f"{out}/edit-replay.{a}.jsonl")} for a in arms}
    ref = res["radix"]
    ref_logits = logits(f"{out}/edit-replay.radix.logits")
    print("### edit-replay\n")
    print("| arm | replay hit rate | all-call hit rate | replay prompt tokens | first-token agreement | "
          f"{max_tokens}-token agreement | KL mean | KL max | run s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for a in arms:
        rs = res[a]
        replay = [r for i, r in rs.items() if i.split(".")[1] == "7"]  # stage 7 of a session: the replay
        ids = [r["id"] for r in replay]
        lg = logits(f"{out}/edit-replay.{a}.logits")
        kls = [kl(ref_logits[i], lg[i]) for i in ids if i in lg and i in ref_logits]
        first = sum(1 for i in ids if max(range(len(lg[i])), key=lg[i].__getitem__) == max(range(len(ref_logits[i])), key=ref_logits[i].__getitem__))
        same = sum(1 for i in ids if rs[i]["text"] == ref[i]["text"])
        secs = open(f"{out}/edit-replay.{a}.secs").read().strip()
        print(f"| {a} | {hit(replay):.1f}% | {hit(list(rs.values())):.1f}% | {sum(r['prompt_tokens'] for r in replay)} | "
              f"{100.0 * first / len(ids):.1f}% | {100.0 * same / len(ids):.1f}% | {sum(kls) / max(1, len(kls)):.4f} | "
              f"{max(kls, default=0):.4f} | {secs} |")


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "edit-replay":
        edit_replay(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "cross-tenant":
        cross_tenant(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "report":
        report(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
