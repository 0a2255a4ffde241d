#!/usr/bin/env python3
"""Cache directives for `braid sim` traces (docs/TRACE_FORMAT.md, "directives").

Reads a trace that `braid-bench gen --trace-tokens` wrote and writes the same trace with the
directives a Leyline client would send (bench/directives_transform.py is the live counterpart):

    sim_directives_trace.py edit-replay IN OUT [--mode amortize|forget] [--followups K] [--pin-ttl S]
    sim_directives_trace.py cross-tenant IN OUT [--share all|none] [--tenants T]

edit-replay (Leyline App. B): every "replay" call splices the workflow's last "build" call (its
context): the edit is the token span where the two differ (common prefix and suffix stripped).
--followups K appends K later turns of each replayed conversation (each extends the one before by
a user question of 24-40 tokens, 1 s apart, after the replay). --pin-ttl S pins every build call's
prompt for S seconds of trace time (the conversation stays while it is being built; each turn's pin
extends the last one's). Without a splice the trace is still written with token ids, so `braid sim
--directives off` replays the same calls without directives.

cross-tenant (Leyline § 5, App. U): every call shares its prompt, through the longest prefix it has
in common with a call of another workflow (the article's end), with all tenants (--share all),
or with none (--share none: the same trace with no directives; `braid sim --directives off` on the
shared trace is the same "off" arm). --tenants T relabels workflow i (in order of first arrival)
as tenant "t<i mod T>" (the generator's own split is 4): the tenant sweep of App. U. Relabelled
traces keep the generator's block hashes, which name the old namespaces, so replay them with
directives (token ids), on or off, never as plain hash traces.
"""
import argparse
import hashlib
import json
import random


def rows(path):
    return [json.loads(line) for line in open(path) if line.strip()]


def write(path, items):
    with open(path, "w") as f:
        for r in items:
            f.write(json.dumps(r, separators=(",", ":")) + "\n")


def changed_span(old, new):
    """(p, old_end, new_end): old[p:old_end] became new[p:new_end]; the rest is common."""
    n = min(len(old), len(new))
    p = 0
    while p < n and old[p] == new[p]:
        p += 1
    s = 0
    while s < n - p and old[len(old) - 1 - s] == new[len(new) - 1 - s]:
        s += 1
    return p, len(old) - s, len(new) - s


def requests(items):
    return [r for r in items if r.get("type") == "request"]


def check_tokens(reqs):
    for r in reqs:
        if "tokens" not in r:
            raise SystemExit(f"request {r.get('id')} has no token ids: write the trace with braid-bench gen --trace-tokens")


def extend_blocks(r, tokens, block_size):
    """Block hashes for a prompt that extends r's: r's own, then new ones chained from the last (a
    stand-in for braid's XXH3 chain: a replay with directives keys the cache by token ids)."""
    blocks = list(r["blocks"])
    prev = blocks[-1] if blocks else "0" * 16
    for b in range(len(blocks), len(tokens) // block_size):
        chunk = ",".join(map(str, tokens[b * block_size:(b + 1) * block_size]))
        prev = hashlib.blake2b((prev + chunk).encode(), digest_size=8).hexdigest()
        blocks.append(prev)
    return blocks


def edit_replay(items, mode, followups, pin_ttl, seed):
    reqs = requests(items)
    check_tokens(reqs)
    last_build, replays = {}, []
    for r in sorted(reqs, key=lambda r: (r["t"], r["seq"])):
        wf = r["workflow"]
        if r["agent"] == "build":
            last_build[wf] = r
            if pin_ttl > 0:
                r["directives"] = [{"op": "pin", "end": r["prompt_tokens"] // r["block_size"] * r["block_size"], "ttl_s": pin_ttl}]
        elif r["agent"] == "replay" and wf in last_build:
            ctx = last_build[wf]
            p, old_end, new_end = changed_span(ctx["tokens"], r["tokens"])
            d = []
            if mode != "none" and p < len(ctx["tokens"]):
                d.append({"op": "splice", "context": ctx["id"], "start": p, "end": old_end, "tokens": new_end - p, "mode": mode})
            if d:
                r["directives"] = d
            replays.append(r)
    rng = random.Random(seed)
    seq = max((r["seq"] for r in reqs), default=0) + 1
    added = []
    for r in replays:
        prev = r
        for k in range(1, followups + 1):
            question = [rng.randrange(1000, 40000) for _ in range(rng.randrange(24, 41))]
            tokens = prev["tokens"] + question
            f = dict(prev, seq=seq, t=r["t"] + k, id=f"{r['id']}.f{k}", agent="followup", tokens=tokens, prompt_tokens=len(tokens),
                     blocks=extend_blocks(prev, tokens, r["block_size"]))
            f.pop("directives", None)
            f.pop("chunks", None)
            f.pop("hidden", None)
            added.append(f)
            prev, seq = f, seq + 1
    return items + added


def relabel_tenants(reqs, tenants):
    order = {}
    for r in sorted(reqs, key=lambda r: (r["t"], r["seq"])):
        order.setdefault(r["workflow"], len(order))
    for r in reqs:
        r["tenant"] = f"t{order[r['workflow']] % tenants}"


def cross_tenant(items, share, tenants):
    reqs = requests(items)
    check_tokens(reqs)
    if tenants > 0:
        relabel_tenants(reqs, tenants)
    if share == "none":
        return items
    for r in reqs:
        best = 0
        for o in reqs:
            if o["workflow"] == r["workflow"]:
                continue
            a, b = r["tokens"], o["tokens"]
            n, p = min(len(a), len(b)), 0
            while p < n and a[p] == b[p]:
                p += 1
            best = max(best, p)
        end = best // r["block_size"] * r["block_size"]
        if end > 0:
            r["directives"] = [{"op": "share", "end": end, "all": True}]
    return items


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["edit-replay", "cross-tenant"])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--mode", default="amortize", choices=["amortize", "forget", "none"])
    ap.add_argument("--followups", type=int, default=0)
    ap.add_argument("--pin-ttl", type=float, default=0.0)
    ap.add_argument("--share", default="all", choices=["all", "none"])
    ap.add_argument("--tenants", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    items = rows(a.input)
    if a.kind == "edit-replay":
        out = edit_replay(items, a.mode, a.followups, a.pin_ttl, a.seed)
    else:
        out = cross_tenant(items, a.share, a.tenants)
    write(a.output, out)


if __name__ == "__main__":
    main()
