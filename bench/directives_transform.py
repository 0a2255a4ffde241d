#!/usr/bin/env python3
"""Inputs and report of bench/directives_study.sh (cache directives, issue 18).

    directives_transform.py edit-replay BATCH OUT_PREFIX MAX_TOKENS   writes OUT.in-plain/.in-amortize/.in-forget.jsonl
    directives_transform.py cross-tenant BATCH OUT_PREFIX MAX_TOKENS  writes OUT.in-plain/.in-share.jsonl
    directives_transform.py edit-followup BATCH OUT_PREFIX MAX_TOKENS writes OUT.in-plain/-amortize/-amortize-noscope/-auto.jsonl
    directives_transform.py report OUT_DIR MAX_TOKENS / followup-report OUT_DIR MAX_TOKENS
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


FOLLOWUPS = 3


def followup_prompt(replay, k):
    """The replay conversation continued by k more user turns (each extends the one before)."""
    turns = "".join(f"Follow-up {i}: what changes in step {i} if the budget is cut by {10 * i} percent?\n\n### Assistant\n"
                    f"Step {i} keeps its order; only the {i}-th estimate moves.\n\n### User\n" for i in range(1, k))
    return replay + "The answer is noted.\n\n### User\n" + turns + f"Follow-up {k}: what changes in step {k} if the budget is cut by {10 * k} percent?\n\n### Assistant\n"


def edit_followup(batch, prefix, max_tokens):
    """edit-replay plus FOLLOWUPS later turns of each replayed conversation, appended round by round
    after every other call (so a turn's predecessor has finished with --max-running 1). Arms:
    plain; amortize (client splice on the replay, follow-ups plain in the same workflow: they match
    the spliced blocks through the conversation scope); amortize-noscope (the same, follow-ups
    without workflow_id: what they got before conversation scopes); auto (every call of the
    workflow sends its prompt as is with "auto_splice": "amortize": the server plans the splice)."""
    calls = rows(batch)
    last_build = {}
    arms = {a: [] for a in ("plain", "amortize", "amortize-noscope", "auto")}
    replays = []
    for r in calls:
        r["max_tokens"] = max_tokens
        r.pop("segment_reuse", None)
        arms["plain"].append(r)
        arms["auto"].append(dict(r, auto_splice="amortize"))
        if r["agent"] == "build":
            last_build[r["workflow_id"]] = r["prompt"]
        if r["agent"] == "replay":
            build = last_build[r["workflow_id"]]
            d = dict(r, prompt=build, directives=[splice_for(build, r["prompt"], "amortize")])
            arms["amortize"].append(d)
            arms["amortize-noscope"].append(d)
            replays.append(r)
        else:
            arms["amortize"].append(r)
            arms["amortize-noscope"].append(r)
    for k in range(1, FOLLOWUPS + 1):
        for r in replays:
            f = dict(r, id=f"{r['workflow_id']}.f{k}", agent="followup", prompt=followup_prompt(r["prompt"], k))
            arms["plain"].append(f)
            arms["amortize"].append(f)
            arms["auto"].append(dict(f, auto_splice="amortize"))
            g = dict(f)
            g.pop("workflow_id")
            arms["amortize-noscope"].append(g)
    for a, items in arms.items():
        write(f"{prefix}.in-{a}.jsonl", items)


def followup_report(out, max_tokens):
    """Hit rates of the replay and of each follow-up round, per arm, and agreement with radix."""
    arms = [a for a in ["radix", "amortize-noscope", "amortize", "auto"] if os.path.exists(f"{out}/edit-followup.{a}.jsonl")]
    res = {a: {r["id"]: r for r in rows(f"{out}/edit-followup.{a}.jsonl")} for a in arms}
    ref_logits = logits(f"{out}/edit-followup.radix.logits")
    rounds = [("replay", lambda i: i.endswith(".7.0"))] + [(f"follow-up {k}", lambda i, k=k: i.endswith(f".f{k}")) for k in range(1, FOLLOWUPS + 1)]
    rounds.append(("follow-ups 1-3", lambda i: ".f" in i))
    print("### edit-replay with follow-up turns\n")
    print("| arm | " + " | ".join(f"{n} hit rate" for n, _ in rounds) + " | all-call hit rate | follow-up first-token agreement | run s |")
    print("|---|" + "---:|" * (len(rounds) + 3))
    for a in arms:
        rs = res[a]
        lg = logits(f"{out}/edit-followup.{a}.logits")
        fu = [i for i in rs if ".f" in i]
        agree = sum(1 for i in fu if max(range(len(lg[i])), key=lg[i].__getitem__) == max(range(len(ref_logits[i])), key=ref_logits[i].__getitem__))
        secs = open(f"{out}/edit-followup.{a}.secs").read().strip()
        cells = [f"{hit([r for i, r in rs.items() if sel(i)]):.1f}%" for _, sel in rounds]
        print(f"| {a} | " + " | ".join(cells) + f" | {hit(list(rs.values())):.1f}% | {100.0 * agree / max(1, len(fu)):.1f}% | {secs} |")


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
    elif cmd == "edit-followup":
        edit_followup(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "followup-report":
        followup_report(sys.argv[2], sys.argv[3])
    elif cmd == "cross-tenant":
        cross_tenant(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif cmd == "report":
        report(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
