#!/usr/bin/env python3
"""Leyline's concurrency (App. B) and tenant (App. U) sweeps in `braid sim`, directives on vs off,
per eviction policy (issue 36).

    directives_sim_sweep.py concurrency OUT [--values 1,2,4,8,16] [--workflows 16] [--kv-tokens 8176]
    directives_sim_sweep.py tenants OUT [--values 1,2,4,8] [--workflows 48] [--concurrency 4] [--kv-tokens 8176]
    common: [--policies lru,pbkv,kvflow] [--scale 0.5] [--followups 3] [--braid BIN] [--bench BIN] [--model GGUF]

concurrency (App. B, the three-arm message-edit microbenchmark): edit-replay generated with at most
C conversations in flight (`braid-bench gen --concurrency C`; the C conversations' turns interleave
in one cache of --kv-tokens), each replay spliced against the conversation's last build call
(bench/sim_directives_trace.py, mode amortize), and --followups later turns after it. Arms:
cache-off (every prompt token computed: analytic), radix (`braid sim --directives off`: the prefix
cache alone), splice (`--directives on`) and, with --pin-ttl S, splice+pin (every build turn also
pins its prompt for S s of trace time; pin budget half the cache, the most pins may take).
tenants (App. U, the cross-tenant Zipf workload): cross-tenant generated once, relabelled to T
tenants (workflow i -> tenant i mod T), every call sharing its prompt through the article with all
tenants. Arms: share off (`--directives off`: each tenant's cache is its own) and share on.
Reported per cell: hit rate (cached incl. copies / prompt tokens; replay-phase and follow-ups
separately for App. B), prefill saved (1 - computed / prompt tokens), the latency proxy (modeled
mean TTFT = computed tokens x prefill cost + copy time, and mean workflow latency, no queueing
between conversations) and the peak device pool occupancy (blocks).
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREFILL_S = 1.0 / 400  # braid sim's default prefill cost per token


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return p.stdout


def gen(a, workload, workflows, concurrency, out):
    run([a.bench, "gen", "--workload", workload, "--workflows", str(workflows), "--concurrency", str(concurrency), "--scale",
         str(a.scale), "--model", a.model, "--trace-tokens", "--out", out])


def sim(a, trace, policy, directives, timeline, extra=()):
    out = run([a.braid, "sim", "--trace", trace, "--kv-tokens", str(a.kv_tokens), "--policy", policy, "--directives", directives,
               "--json", "--timeline", timeline, *extra])
    r = json.loads(out.strip().splitlines()[-1])
    rows = [json.loads(line) for line in open(timeline) if line.strip()][1:]
    return r, rows


def hit(rows, sel=lambda r: True):
    rs = [r for r in rows if sel(r)]
    p = sum(r["prompt_tokens"] for r in rs)
    return 100.0 * sum(r["cached_tokens"] for r in rs) / p if p else 0.0


def ttft_ms(rows, sel=lambda r: True):
    rs = [r for r in rows if sel(r)]
    return 1e3 * sum(r["ttft_s"] for r in rs) / len(rs) if rs else 0.0


def cell(r, rows, extra):
    saved = 100.0 * (1 - r["computed_tokens"] / r["prompt_tokens"]) if r["prompt_tokens"] else 0.0
    return dict(extra, hit=hit(rows), saved=saved, ttft_ms=1e3 * r["mean_ttft_s"], wf_s=r["mean_workflow_latency_s"],
                peak=r["peak_base_blocks"], copied=(r.get("directives") or {}).get("hit_tokens", 0))


def concurrency(a):
    print(f"### App. B in the simulator: edit-replay, {a.workflows} conversations, {a.followups} follow-ups after each edit, "
          f"{a.kv_tokens}-token device cache\n")
    print("| concurrency | policy | arm | replay hit | follow-up hit | all-call hit | prefill saved | replay TTFT ms | mean TTFT ms "
          "| mean workflow s | peak blocks |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    replay = lambda r: r["agent"] == "replay"
    followup = lambda r: r["agent"] == "followup"
    for c in a.values:
        base = f"{a.out}/er.c{c}"
        gen(a, "edit-replay", a.workflows, c, base + ".trace")
        run([sys.executable, f"{ROOT}/bench/sim_directives_trace.py", "edit-replay", base + ".trace", base + ".dir.trace", "--followups",
             str(a.followups)])
        arms = [("radix", "off", ".dir.trace", ()), ("splice", "on", ".dir.trace", ())]
        if a.pin_ttl > 0:
            run([sys.executable, f"{ROOT}/bench/sim_directives_trace.py", "edit-replay", base + ".trace", base + ".pin.trace", "--followups",
                 str(a.followups), "--pin-ttl", str(a.pin_ttl)])
            arms.append(("splice+pin", "on", ".pin.trace", ("--pin-budget", str(a.kv_tokens // 2))))
        off_rows = None
        for policy in a.policies:
            for arm, d, suffix, extra in arms:
                r, rows = sim(a, base + suffix, policy, d, f"{base}.{policy}.{arm}.timeline", extra)
                off_rows = rows
                c_ = cell(r, rows, {})
                print(f"| {c} | {policy} | {arm} | {hit(rows, replay):.1f}% | {hit(rows, followup):.1f}% | {c_['hit']:.1f}% | "
                      f"{c_['saved']:.1f}% | {ttft_ms(rows, replay):.0f} | {c_['ttft_ms']:.0f} | {c_['wf_s']:.2f} | {c_['peak']} |")
                sys.stdout.flush()
        # cache-off: every prompt token computed (no cache to hold anything)
        rt = [r["prompt_tokens"] * PREFILL_S * 1e3 for r in off_rows if replay(r)]
        at = [r["prompt_tokens"] * PREFILL_S * 1e3 for r in off_rows]
        print(f"| {c} | - | cache-off | 0.0% | 0.0% | 0.0% | 0.0% | {sum(rt) / len(rt):.0f} | {sum(at) / len(at):.0f} | | 0 |")


def tenants(a):
    print(f"### App. U in the simulator: cross-tenant, {a.workflows} reading sessions, {a.concurrency} in flight, "
          f"{a.kv_tokens}-token device cache\n")
    print("| tenants | policy | arm | hit rate | prefill saved | tokens copied across tenants | mean TTFT ms | mean workflow s "
          "| peak blocks |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|")
    base = f"{a.out}/ct"
    gen(a, "cross-tenant", a.workflows, a.concurrency, base + ".trace")
    for t in a.values:
        tr = f"{base}.t{t}.trace"
        run([sys.executable, f"{ROOT}/bench/sim_directives_trace.py", "cross-tenant", base + ".trace", tr, "--tenants", str(t)])
        for policy in a.policies:
            for arm, d in (("share off", "off"), ("share on", "on")):
                r, rows = sim(a, tr, policy, d, f"{base}.t{t}.{policy}.{d}.timeline")
                c_ = cell(r, rows, {})
                print(f"| {t} | {policy} | {arm} | {c_['hit']:.1f}% | {c_['saved']:.1f}% | {c_['copied'] if d == 'on' else 0} | "
                      f"{c_['ttft_ms']:.0f} | {c_['wf_s']:.2f} | {c_['peak']} |")
                sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweep", choices=["concurrency", "tenants"])
    ap.add_argument("out")
    ap.add_argument("--values", default=None)
    ap.add_argument("--workflows", type=int, default=None)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--kv-tokens", type=int, default=8176)
    ap.add_argument("--policies", default="lru,pbkv,kvflow")
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--followups", type=int, default=3)
    ap.add_argument("--pin-ttl", type=float, default=0.0, help="concurrency: also a splice+pin arm (build turns pinned for S s, "
                    "pin budget half the cache)")
    ap.add_argument("--braid", default=os.environ.get("BRAID_BIN", f"{ROOT}/build/braid"))
    ap.add_argument("--bench", default=os.environ.get("BRAID_BENCH_BIN", f"{ROOT}/build/braid-bench"))
    ap.add_argument("--model", default=os.environ.get("BRAID_MODEL", f"{ROOT}/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    a.policies = a.policies.split(",")
    if a.sweep == "concurrency":
        a.values = [int(v) for v in (a.values or "1,2,4,8,16").split(",")]
        a.workflows = a.workflows or 16
        concurrency(a)
    else:
        a.values = [int(v) for v in (a.values or "1,2,4,8").split(",")]
        a.workflows = a.workflows or 48
        tenants(a)


if __name__ == "__main__":
    main()
