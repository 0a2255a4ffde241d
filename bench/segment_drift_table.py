#!/usr/bin/env python3
"""Tables for bench/segment_drift_scale.sh: drift and prefill saved per arm against the `off` arm,
which diverging calls reused spans themselves or inherited approximate K/V from an earlier call of
their workflow, and (when a `diag` arm ran) the per-layer cosine of reused vs recomputed K and V.

Usage: segment_drift_table.py OUT_DIR MAX_TOKENS "WORKLOADS" "ARMS"
"""
import base64
import json
import math
import os
import struct
import sys


def rows(path):
    return {r["id"]: r for r in map(json.loads, open(path))}


def logits(path):
    d = {}
    if not os.path.exists(path):
        return d
    for line in open(path):
        r = json.loads(line)
        raw = base64.b64decode(r["logits"])
        d[r["id"]] = struct.unpack(f"<{len(raw) // 4}f", raw)
    return d


def log_softmax(x):
    m = max(x)
    s = math.log(sum(math.exp(v - m) for v in x)) + m
    return [v - s for v in x]


def kl(p, q):
    lp, lq = log_softmax(p), log_softmax(q)
    return sum(math.exp(a) * (a - b) for a, b in zip(lp, lq))


def argmax(x):
    return max(range(len(x)), key=x.__getitem__)


def margin(x):
    """Top-1 minus top-2 logit: how close the greedy choice was to a tie."""
    a, b = sorted(x, reverse=True)[:2]
    return a - b


def events(path):
    ok = rej = 0
    layers = []
    if os.path.exists(path):
        for line in open(path):
            if '"probe_ok"' in line:
                ok += 1
            elif '"probe_rejected"' in line:
                rej += 1
            elif '"probe_layers"' in line:
                layers.append(json.loads(line))
    return ok, rej, layers


def workflow_of(rid):
    return rid.split(".")[0]


def main():
    out, max_tokens, workloads, arms = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
    print(f"| workload | arm | calls | prompt tokens | prefix-cached | segment-reused | prefill saved by reuse | saved with prefix cache "
          f"| prefill computed (× off) | first-token changed | {max_tokens}-token agreement | KL mean | KL max | probes admitted / rejected | run s (load) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    diverged = []
    layer_tables = []
    for wl in workloads:
        base_path = f"{out}/{wl}.off.jsonl"
        if not os.path.exists(base_path):
            continue
        base = rows(base_path)
        base_l = logits(f"{out}/{wl}.off.logits")
        for arm in arms:
            path = f"{out}/{wl}.{arm}.jsonl"
            if not os.path.exists(path):
                continue
            r = rows(path)
            lg = logits(f"{out}/{wl}.{arm}.logits")
            ids = [i for i in base if "error" not in base[i] and i in r and "error" not in r[i]]
            if not ids:
                continue
            prompt = sum(base[i]["prompt_tokens"] for i in ids)
            # What the arm still had to compute, against the off arm on the same calls: approximate
            # K/V that later calls may not take (--approx-prefix off) can cost more than reuse saves.
            computed_off = sum(base[i]["prompt_tokens"] - base[i]["cached_tokens"] for i in ids)
            cached = sum(r[i]["cached_tokens"] for i in ids)
            reused = sum(r[i].get("segment_reused_tokens", 0) for i in ids)
            first_changed = sum(1 for i in ids if i in lg and i in base_l and argmax(base_l[i]) != argmax(lg[i]))
            same = [i for i in ids if base[i]["text"] == r[i]["text"]]
            kls = [kl(base_l[i], lg[i]) for i in ids if i in lg and i in base_l] or [0.0]
            ok, rej, layers = events(f"{out}/{wl}.{arm}.events")
            secs = open(f"{out}/{wl}.{arm}.secs").read().split() if os.path.exists(f"{out}/{wl}.{arm}.secs") else ["-", "-"]
            computed = prompt - cached - reused
            print(f"| {wl} | {arm} | {len(ids)} | {prompt} | {cached} | {reused} | {100 * reused / prompt:.1f}% | "
                  f"{100 * (reused + cached) / prompt:.1f}% | {computed} ({computed / max(computed_off, 1):.2f}×) | {100 * first_changed / len(ids):.1f}% ({first_changed}) | "
                  f"{100 * len(same) / len(ids):.1f}% | {sum(kls) / len(kls):.4f} | {max(kls):.4f} | {ok} / {rej} | {secs[0]} ({secs[-1]}) |")
            if arm not in ("off", "exact"):
                diverged.append((wl, arm, ids, base, r, base_l))
            if layers:
                layer_tables.append((wl, arm, layers))

    # Which calls diverged: own spans, or only approximate K/V inherited from an earlier call of the
    # workflow (no spans of their own); and how near a tie the first token was.
    print()
    print("| workload | arm | calls diverged | with own reused spans | with no own spans, after an approximate call of their workflow "
          "| with no own spans, no approximate call before | median first-token margin: diverged / agreed (logits) "
          "| calls with own spans: diverged / all | later calls of a workflow that reused: diverged / all |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for wl, arm, ids, base, r, base_l in diverged:
        order = [i for i in r]  # output order = input order
        approx_seen = set()
        own = inherited = neither = 0
        own_all = after_all = 0  # every call with own spans / with none after a reuse in its workflow, diverged or not
        m_div, m_ok = [], []
        for i in order:
            if i not in ids:
                continue
            mine = r[i].get("segment_reused_tokens", 0)
            own_all += mine > 0
            after_all += mine == 0 and workflow_of(i) in approx_seen
            if base[i]["text"] != r[i]["text"]:
                if mine > 0:
                    own += 1
                elif workflow_of(i) in approx_seen:
                    inherited += 1
                else:
                    neither += 1
                if i in base_l:
                    m_div.append(margin(base_l[i]))
            elif i in base_l:
                m_ok.append(margin(base_l[i]))
            if mine > 0:
                approx_seen.add(workflow_of(i))
        med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
        n_div = own + inherited + neither
        print(f"| {wl} | {arm} | {n_div} | {own} | {inherited} | {neither} | {med(m_div):.2f} / {med(m_ok):.2f} | "
              f"{own} / {own_all} | {inherited} / {after_all} |")

    for wl, arm, layers in layer_tables:
        n_layers = len(layers[0]["k_mean"])
        tokens = sum(l["probe_tokens"] for l in layers)
        print()
        print(f"Per-layer cosine, reused (delta-RoPE rotated) vs recomputed K and V — {wl}, arm {arm}: "
              f"{len(layers)} spans, {tokens} tokens (token-weighted mean; min over all tokens)")
        print()
        print("| layer | K mean | K min | V mean | V min |")
        print("|---:|---:|---:|---:|---:|")
        for l in range(n_layers):
            km = sum(s["k_mean"][l] * s["probe_tokens"] for s in layers) / tokens
            vm = sum(s["v_mean"][l] * s["probe_tokens"] for s in layers) / tokens
            kmin = min(s["k_min"][l] for s in layers)
            vmin = min(s["v_min"][l] for s in layers)
            print(f"| {l} | {km:.5f} | {kmin:.5f} | {vm:.5f} | {vmin:.5f} |")


if __name__ == "__main__":
    main()
