#!/usr/bin/env python3
"""Leyline's positional contract, live (issue 36: the paper's §4.1 microbenchmark and App. E's
randomized signed-Δ edit suite), against a running `braid serve` (bench/leyline_contract.sh).

    leyline_contract.py URL [--trials N] [--seed S] [--tokens K]

Three references per edit, each the greedy continuation (K tokens, default 4) of a prompt P:
  FC  full context: P itself, unedited (and so cached);
  RP  re-prefill:   the edited prompt sent as plain text (every token after the edit computed
                    against the replacement; its prefix before the edit is an exact cache hit);
  L   Leyline:      P again with a `splice` directive in `amortize` mode (only the replacement is
                    computed; the cached tokens after it keep their V and get their K rotated by Δ).
The paper's contract: L tracks FC, not RP — the downstream slots were computed attending to the
original span, and a splice keeps them. Where FC and RP agree the edit did not matter; the
informative trials are those where they diverge.

§4.1 (constructed): each prompt holds a tool result the question needs ("the tool returned 34"),
and the edit replaces that result with a stub, so FC and RP should disagree on the answer.
App. E (randomized): over base prompts of agent-style text, one or two non-overlapping edits per
turn at random sentence positions, replacement lengths drawn so Δ is negative or positive, and
two stub modes: `random` (random in-vocabulary words) and `semantic` (a fixed placeholder string).
Reported per cell: trials, FC≠RP (diverging), and among diverging trials how often L's first
content token (the first that is not only whitespace) matches FC only, RP only, or neither; plus
L's K-token agreement with each reference.
"""
import argparse
import json
import random
import sys
import urllib.error
import urllib.request

WORDS = ("alpha river stone window market yellow engine silver garden copper forest signal harbor "
         "planet ticket marble bridge lantern velvet orbit canyon pepper meadow rocket timber violet").split()
PLACEHOLDER = "[tool output elided]"


def post(url, body, timeout=900):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def complete(url, prompt, tokens, tenant, directives=None):
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "tenant": tenant,
            "logprobs": 0}
    if directives:
        body["directives"] = directives
    status, r = post(url, body)
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {json.dumps(r)[:300]}")
    lp = r["choices"][0].get("logprobs") or {}
    toks = lp.get("tokens") or []
    if not toks:  # no per-token logprobs: compare the text's first characters instead
        text = r["choices"][0]["text"]
        toks = [text[:8], text]
    return toks, r


def splice_outcomes(r):
    return [o for o in r.get("directive_outcomes", []) if o.get("op") == "splice"]


# ---- §4.1: constructed prompts where the edited span carries the answer ----

FILLER = ["Assistant: I will check the remaining items of the plan before answering.",
          "User: fine, but keep the log short and do not call any other tool.",
          "Assistant: understood; the plan has three items and two are done.",
          "User: the third item can wait until tomorrow morning.",
          "Assistant: then I will close the plan for today and keep the notes.",
          "User: good. One more question before you close it."]


def constructed_cases(rng, n, tail):
    """tail: filler lines between the tool result and the question, so that most of what follows
    the edit is kept from the cache (rotated) rather than in the recomputed last partial block."""
    cases = []
    for i in range(n):
        a, b = rng.randint(11, 49), rng.randint(11, 49)
        tool = rng.choice(["calculator", "ledger", "inventory", "scheduler"])
        result = f"The {tool} tool returned {a + b}."
        prompt = (f"Agent log {i}.\nUser: add {a} and {b} with the {tool} tool, then report the number.\n"
                  f"Assistant: calling {tool}.\nTool: {result}\n"
                  f"Assistant: noted.\n" + "".join(line + "\n" for line in FILLER[:tail]) +
                  f"User: what number did the {tool} tool return? Answer with the number only.\n"
                  f"Assistant: The {tool} tool returned")
        cases.append({"prompt": prompt, "edits": [(result, PLACEHOLDER)]})
    return cases


# ---- App. E: randomized edits over agent-style base prompts ----

def base_prompt(rng, k):
    lines = [f"Trajectory {k}. The planner asked the coder to fix module m{k}."]
    for s in range(14):
        x, y = rng.randint(2, 99), rng.randint(2, 99)
        lines.append(rng.choice([
            f"Step {s}: the tester ran case {x} and saw {y} failures in file f{x % 7}.py.",
            f"Step {s}: the coder patched line {x} of m{k} to return {y} when the cache is cold.",
            f"Step {s}: the planner noted that build {x} took {y} seconds on runner r{x % 5}.",
            f"Step {s}: the tool listed {x} files, {y} of them changed since the last commit.",
        ]))
    lines.append("Question: which step mentioned the most failures, and how many were there?\nAnswer: Step")
    return "\n".join(lines)


def random_edits(rng, prompt, n_edits, sign, stub):
    sentences = [ln for ln in prompt.split("\n")[1:-2]]
    picks = sorted(rng.sample(range(len(sentences)), n_edits))
    edits = []
    for p in picks:
        old = sentences[p]
        n_old = len(old.split())
        # Δ < 0: a shorter replacement; Δ > 0: a longer one (in words, so roughly in tokens too).
        n_new = rng.randint(2, max(2, n_old // 2)) if sign < 0 else rng.randint(n_old + 3, 2 * n_old + 6)
        new = PLACEHOLDER if stub == "semantic" else " ".join(rng.choice(WORDS) for _ in range(n_new))
        if stub == "semantic" and sign > 0:
            new = " ".join([PLACEHOLDER] * max(2, n_new // 3))
        edits.append((old, new))
    return edits


def apply_edits(prompt, edits):
    for old, new in edits:
        assert prompt.count(old) == 1, old
        prompt = prompt.replace(old, new)
    return prompt


def run_trial(url, prompt, edits, tokens, tenant, verbose=False):
    fc, _ = complete(url, prompt, tokens, tenant)
    directives = [{"op": "splice", "span": {"match": old}, "replacement": new, "mode": "amortize"} for old, new in edits]
    lv, r = complete(url, prompt, tokens, tenant, directives)
    outcomes = splice_outcomes(r)
    accepted = bool(outcomes) and all(o.get("outcome") == "accepted" for o in outcomes)
    rp, _ = complete(url, apply_edits(prompt, edits), tokens, tenant + "-rp")
    delta = sum(o.get("delta", 0) for o in outcomes)
    # What the splice kept from the cache (rotated, V unchanged) and what it computed after the edit.
    rotated = sum(o.get("rotated_tokens", 0) for o in outcomes)
    recomputed = sum(o.get("recomputed_tokens", 0) for o in outcomes)
    if verbose:
        print(f"  {tenant}: Δ {delta} rotated {rotated} recomputed {recomputed} FC {fc!r} RP {rp!r} L {lv!r}",
              file=sys.stderr, flush=True)
    return {"fc": fc, "rp": rp, "l": lv, "accepted": accepted, "delta": delta, "rotated": rotated, "recomputed": recomputed}


def agree(a, b):
    n = min(len(a), len(b))
    return sum(1 for i in range(n) if a[i] == b[i]) / n if n else 0.0


def first_content(tokens):
    """The first token that is not only whitespace: this tokenizer puts the space before an answer in
    a token of its own, which every reference shares."""
    return next((tok for tok in tokens if tok.strip()), tokens[0] if tokens else "")


def summarize(name, trials):
    ok = [t for t in trials if t["accepted"]]
    first = {id(t): {k: first_content(t[k]) for k in ("fc", "rp", "l")} for t in ok}
    div = [t for t in ok if first[id(t)]["fc"] != first[id(t)]["rp"]]
    cnt = {"FC only": 0, "RP only": 0, "both": 0, "neither": 0}
    for t in ok:
        f, r = first[id(t)]["l"] == first[id(t)]["fc"], first[id(t)]["l"] == first[id(t)]["rp"]
        if t in div:
            cnt["FC only" if f and not r else "RP only" if r and not f else "neither"] += 1
        else:
            cnt["both"] += f and r
    agree_fc = sum(agree(t["l"], t["fc"]) for t in ok) / len(ok) if ok else 0
    agree_rp = sum(agree(t["l"], t["rp"]) for t in ok) / len(ok) if ok else 0
    deltas = [t["delta"] for t in ok]
    kept = sum(t["rotated"] for t in ok) / len(ok) if ok else 0
    print(f"| {name} | {len(trials)} | {len(ok)} | {min(deltas, default=0)}..{max(deltas, default=0)} | {kept:.0f} | {len(div)} | "
          f"{cnt['FC only']} | {cnt['RP only']} | {cnt['neither']} | {cnt['both']} of {len(ok) - len(div)} | "
          f"{agree_fc:.2f} | {agree_rp:.2f} |", flush=True)
    return {"cell": name, "trials": len(trials), "accepted": len(ok), "diverging": len(div), "rotated_mean": kept, **cnt,
            "agree_fc": agree_fc, "agree_rp": agree_rp}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("--trials", type=int, default=10, help="trials per randomized cell (the paper: 40)")
    ap.add_argument("--constructed", type=int, default=12, help="§4.1 constructed prompts")
    ap.add_argument("--tokens", type=int, default=4, help="greedy tokens compared per reference")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", help="write the per-cell figures here")
    ap.add_argument("--verbose", action="store_true", help="each trial's three continuations on stderr")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print("| cell | trials | splice accepted | Δ range (tokens) | rotated tokens (mean) | FC≠RP | L = FC only | L = RP only | L = neither | "
          "L = both (non-diverging) | L vs FC, K-token agreement | L vs RP, K-token agreement |")
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    cells = []
    for tail in (0, 6):
        trials = [run_trial(a.url, c["prompt"], c["edits"], a.tokens, f"c41-{tail}-{i}", a.verbose)
                  for i, c in enumerate(constructed_cases(rng, a.constructed, tail))]
        cells.append(summarize(f"§4.1 constructed: tool result → placeholder, {tail} lines after it", trials))
    bases = [base_prompt(rng, k) for k in range(4)]
    # One edit per turn in both stub modes and both signs; two edits per turn with random stubs.
    for sign, stub, n_edits in ((-1, "random", 1), (-1, "semantic", 1), (+1, "random", 1), (+1, "semantic", 1),
                                (-1, "random", 2), (+1, "random", 2)):
        trials = []
        for t in range(a.trials):
            prompt = bases[t % len(bases)]
            edits = random_edits(rng, prompt, n_edits, sign, stub)
            trials.append(run_trial(a.url, prompt, edits, a.tokens, f"e-{sign}-{stub}-{n_edits}-{t}", a.verbose))
        cells.append(summarize(f"App. E: Δ {'<' if sign < 0 else '>'} 0, {stub} stub, {n_edits} edit(s)", trials))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(cells, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
