#!/usr/bin/env python3
"""sim_vs_live.py — checks braid sim --instances against live multi-node arms (issue 33 item 5).

For each live arm directory (as bench/multinode_bench.sh writes them: NAME = WORKLOAD-Kn-MOVES-RATE, holding
live.json, run/trace.jsonl and run/summary.json) it replays the arm's own trace (the requests as sent, when
they were sent, their real output lengths) with `braid sim --instances K`, once per cluster replay asked
for (--replays batch,fifo: the batching instances, the default since issue 33's last item, and the one
request at a time replay before it), with the per-token compute calibrated per replay so that the
replay's mean TTFT equals the arm's (bisection in the log domain; decode cost = DECODE_RATIO x prefill),
and prints one markdown row per arm: hit rate and blocks / bytes moved, live and per replay, the hit
rate's difference in points, simulated over live bytes, and whether the arm meets the goal (hit rate
within 2 points, bytes within 10 %, or no bytes on either side).

The router and the KV pool come from the arm's parent directory's table.md header (ROUTER=, KV_BLOCKS=),
else --router / --kv-blocks. KV bytes a token: what the live pool moved (bytes / blocks / 16), else 23040
(SmolLM2-135M in fp16).

    bench/sim_vs_live.py --braid build/braid OUT/*/cross-tenant-2n-on-10gbit ...
    bench/sim_vs_live.py --braid build/braid --replays batch --format bench DIR   # multinode_bench.sh's row
"""
import argparse
import json
import os
import re
import subprocess
import sys

GOAL_POINTS, GOAL_BYTES = 2.0, 0.10
DECODE_RATIO = 4.0
LIVE_BLOCK_BYTES = 368704  # a block as the live CPU pool moves it (SmolLM2-135M: 16 x 23040 + 64)
# Replays by name: braid sim options. "batch-live": the batching replay with the cost router starting
# from braid serve's default rates (--move-prefill-tps 1000, --move-gbps 1), as the live arms' router did,
# and learning from there; "batch": its router starts at the replay's own (calibrated) rates.
LIVE_ROUTER = ["--router-prefill-tps", "1000", "--router-link-gbps", "1"]
REPLAYS = {"batch": ["--cluster-replay", "batch"], "fifo": ["--cluster-replay", "fifo"],
           "batch-live": ["--cluster-replay", "batch"] + LIVE_ROUTER,
           "batch-closed": ["--cluster-replay", "batch", "--closed-loop"] + LIVE_ROUTER,
           "batch-coord": ["--cluster-replay", "batch"] + LIVE_ROUTER,
           "batch-closed-coord": ["--cluster-replay", "batch", "--closed-loop"] + LIVE_ROUTER}
# "batch-closed": batch-live with the workflows sent as braid-bench run's client sent them (--closed-loop: as many
# at once as it ran, each stage when the one before it answered in the replay).
# "batch-coord": batch-live with each request arriving when the live coordinator routed it (its events.jsonl "route"
# lines), not when the client sent it: the order in which near-simultaneous requests reached the router is the live one.
# "batch-closed-coord": batch-closed on that trace: the client model claims the workflows in the order their first
# calls reached the coordinator (a first wave sent at once reaches it in an order of its own), and a stage's calls keep
# the offsets at which the coordinator routed them.
COORD_ARRIVALS = {"batch-coord", "batch-closed-coord"}


def live_pools(d):
    """(device blocks an instance uses, host-tier blocks) from the arm's serve.log, or (None, 0)."""
    try:
        log = open(os.path.join(d, "serve.log")).read()
    except OSError:
        return None, 0
    m = re.search(r"ready: \d+ ranks, (\d+) KV blocks of \d+ tokens(?:, host tier (\d+) blocks)?", log)
    return (int(m[1]), int(m[2] or 0)) if m else (None, 0)


def coordinator_trace(d, out):
    """A copy of the arm's trace whose request times are when the coordinator routed each request (events.jsonl),
    matched by workflow, then prompt blocks, in order; False when the arm has no route events."""
    try:
        routes = [e for e in map(json.loads, open(os.path.join(d, "events.jsonl"))) if e.get("event") == "route"]
    except (OSError, ValueError):
        return False
    lines = [json.loads(line) for line in open(os.path.join(d, "run", "trace.jsonl"))]
    reqs = sorted((x for x in lines if x.get("type") == "request"), key=lambda x: (x["t"], x["seq"]))
    if not routes or len(routes) != len(reqs):
        return False
    t0 = routes[0]["t"] - reqs[0]["t"]
    free = list(reqs)
    for e in routes:
        same = [x for x in free if x.get("workflow", "") == e.get("workflow", "")]
        pick = next((x for x in same if len(x.get("blocks", [])) == e.get("prompt_blocks")), same[0] if same else None)
        if pick is None:
            return False
        pick["t"] = e["t"] - t0
        free.remove(pick)
    with open(out, "w") as f:
        for x in lines:
            f.write(json.dumps(x) + "\n")
    return True


def arm_setup(d, args):
    """(router, kv_blocks, instances, moves, link GB/s) of arm directory d."""
    m = re.fullmatch(r".*-(\d+)n-(on|off)-([0-9.]+)([kmg]?)bit", os.path.basename(os.path.normpath(d)))
    if not m:
        sys.exit(f"sim_vs_live: {d}: the name is not WORKLOAD-Kn-MOVES-RATE")
    bits = float(m[3]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[4]]
    router, kv_blocks = args.router, args.kv_blocks
    table = os.path.join(os.path.dirname(os.path.normpath(d)), "table.md")
    if os.path.exists(table):
        head = open(table).read(2000)
        router = router or (re.search(r"ROUTER=([a-z-]+)", head) or [None, None])[1]
        kv = re.search(r"KV_BLOCKS=(\d+)", head)
        kv_blocks = kv_blocks or (int(kv[1]) if kv else None)
    return router or "cost", kv_blocks or 256, int(m[1]), m[2], bits / 8e9


def run_sim(args, d, setup, replay, bpt, prefill_ms, decode_ratio=DECODE_RATIO, extra=()):
    router, kv_blocks, k, moves, gbps = setup
    trace = f"{d}/run/trace.jsonl"
    if replay in COORD_ARRIVALS and os.path.exists(args.coord_traces.get(d, "")):
        trace = args.coord_traces[d]
    device, host = live_pools(d) if replay != "fifo" and not args.no_live_pools else (None, 0)
    pools = ["--kv-tokens", str((device or kv_blocks) * 16)] + (["--host-kv-tokens", str((host - 1) * 16)] if host > 1 else [])
    cmd = [args.braid, "sim", "--trace", trace] + pools + ["--instances", str(k),
           "--router", router, "--moves", moves, "--link-gbps", f"{gbps}", "--link-latency-us", "100",
           "--kv-bytes-per-token", f"{bpt:.3f}", "--prefill-ms-per-token", f"{prefill_ms:.6f}",
           "--decode-ms-per-token", f"{decode_ratio * prefill_ms:.6f}", "--json"] + REPLAYS[replay] + list(extra)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def bisect(lo, hi, steps, too_low):
    """Geometric bisection: the x in [lo, hi] where too_low(x) turns false."""
    for _ in range(steps):
        mid = (lo * hi) ** 0.5
        if too_low(mid):
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


def calibrated(args, d, setup, replay, bpt, target_ttft, target_decode):
    """The replay whose mean TTFT is the arm's (prefill ms a token) and, with --fit-decode, whose mean time from the
    first token to the last is the arm's too (decode ms a token over prefill's; fitted in turns):
    (prefill ms, decode ratio, its JSON)."""
    ratio = DECODE_RATIO
    ms = bisect(0.05, 2000.0, args.iterations, lambda x: run_sim(args, d, setup, replay, bpt, x, ratio)["mean_ttft_s"] < target_ttft)
    for _ in range(args.fit_decode if target_decode else 0):
        def decode_s(r):
            x = run_sim(args, d, setup, replay, bpt, ms, r)
            return x["mean_latency_s"] - x["mean_ttft_s"]
        ratio = bisect(0.05, 100.0, args.iterations, lambda r: decode_s(r) < target_decode)
        ms = bisect(0.05, 2000.0, args.iterations, lambda x: run_sim(args, d, setup, replay, bpt, x, ratio)["mean_ttft_s"] < target_ttft)
    return ms, ratio, run_sim(args, d, setup, replay, bpt, ms, ratio)


def compare(live, x):
    """(points, bytes ratio or None, goal met) of replay x against the live arm."""
    points = round((x["local_hit"] + x["remote_hit"] - live["hit"]) * 100, 6)
    ratio = x["moved_bytes"] / live["moved_bytes"] if live["moved_bytes"] > 0 else None
    if ratio is None:
        bytes_ok = x["moved_bytes"] == 0
    else:
        bytes_ok = abs(ratio - 1) <= GOAL_BYTES
    return points, ratio, abs(points) <= GOAL_POINTS and bytes_ok


def ratio_text(live, x, ratio):
    if ratio is not None:
        return f"{ratio:.2f}"
    return "none" if x["moved_bytes"] == 0 else f"{x['moved_bytes'] / 2**20:.1f} MiB, none live"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--braid", required=True)
    p.add_argument("--replays", default="batch-live,batch,fifo", help="comma-separated: " + ", ".join(REPLAYS))
    p.add_argument("--router")
    p.add_argument("--kv-blocks", type=int)
    p.add_argument("--iterations", type=int, default=40, help="bisection steps of the calibration (24 pin it to 0.05 %%)")
    p.add_argument("--fit-decode", type=int, default=0, metavar="TURNS",
                   help="also fit the decode cost to the arm's mean first-to-last-token time, in TURNS alternations with the "
                        "prefill fit (0: decode = %.0fx prefill)" % DECODE_RATIO)
    p.add_argument("--format", choices=["compare", "bench"], default="compare")
    p.add_argument("--header", action="store_true", help="print the table's header first")
    p.add_argument("--label", help="the arm's name in the table (default: its directory, shortened)")
    p.add_argument("--no-live-pools", action="store_true",
                   help="batch replays: the --kv-blocks pool and no host tier, not the arm's own (serve.log: device blocks, host tier)")
    p.add_argument("--route-log", metavar="DIR",
                   help="after the fit, replay each arm once more per replay with braid sim --route-log "
                        "DIR/<arm directory>-<replay>.jsonl (one line a request: instance, lender, cached and moved tokens)")
    p.add_argument("arms", nargs="+")
    args = p.parse_args()
    args.replays = args.replays.split(",")
    if any(r not in REPLAYS for r in args.replays):
        p.error("--replays takes " + ", ".join(REPLAYS))
    if args.header and args.format == "compare":
        cols = ["arm", "router", "hit live"] + [f"hit {r}" for r in args.replays] + [f"points {r}" for r in args.replays] + \
               ["blocks live"] + [f"blocks {r}" for r in args.replays] + [f"bytes {r} / live" for r in args.replays] + \
               ["failed moves live"] + [f"failed {r}" for r in args.replays] + [f"goal {r}" for r in args.replays]
        print("| " + " | ".join(cols) + " |")
        print("|" + "|".join("---" if c in ("arm", "router") else "---:" for c in cols) + "|")
    if args.header and args.format == "bench":
        print("| worker nodes | moves | links | fitted prefill ms/token | TTFT mean s live / sim | hit live | hit sim | points | "
              "blocks moved live / sim | MiB moved live | MiB moved sim | bytes sim vs live | failed moves live / sim |")
        print("|---:|---|---|---:|---|---:|---:|---:|---|---:|---:|---:|---|")
    totals = {r: [0, 0.0] for r in args.replays}
    args.coord_traces = {}
    if any(r in COORD_ARRIVALS for r in args.replays):
        import tempfile
        tmp = tempfile.mkdtemp(prefix="sim_vs_live.")
        for n, d in enumerate(args.arms):
            out = os.path.join(tmp, f"{n}.jsonl")
            if coordinator_trace(d, out):
                args.coord_traces[d] = out
            else:
                print(f"sim_vs_live: {d}: no route events to take arrivals from; batch-coord replays the client's times", file=sys.stderr)
    for d in args.arms:
        if not (os.path.exists(f"{d}/live.json") and os.path.exists(f"{d}/run/trace.jsonl")):
            print(f"sim_vs_live: {d}: no live.json or run/trace.jsonl, skipped", file=sys.stderr)
            continue
        live = json.load(open(f"{d}/live.json"))
        metrics = json.load(open(f"{d}/run/summary.json"))["metrics"]
        target = metrics["ttft_ms"]["mean"] / 1e3
        target_decode = (metrics["e2el_ms"]["mean"] - metrics["ttft_ms"]["mean"]) / 1e3 if "e2el_ms" in metrics else None
        bpt = live["moved_bytes"] / (live["moved_blocks"] * 16) if live.get("moved_blocks") else 23040
        setup = arm_setup(d, args)
        res = {r: calibrated(args, d, setup, r, bpt, target, target_decode) for r in args.replays}
        if args.route_log:
            os.makedirs(args.route_log, exist_ok=True)
            for r, (ms, ratio, _) in res.items():
                path = os.path.join(args.route_log, f"{os.path.basename(os.path.normpath(d))}-{r}.jsonl")
                run_sim(args, d, setup, r, bpt, ms, ratio, ["--route-log", path])
        res = {r: (v[0], v[2]) for r, v in res.items()}
        if args.format == "bench":
            ms, x = res[args.replays[0]]
            points, ratio, _ = compare(live, x)
            off = f"{ratio - 1:+.0%}" if ratio is not None else ("none live" if x["moved_bytes"] == 0 else "sim only")
            _, _, k, moves, _ = setup
            rate = os.path.basename(os.path.normpath(d)).rsplit("-", 1)[1]
            print(f"| {k} | {moves} | {rate} | {ms:.1f} | {target:.2f} / {x['mean_ttft_s']:.2f} | {live['hit']:.1%} | "
                  f"{x['local_hit'] + x['remote_hit']:.1%} | {points:+.1f} | {live.get('moved_blocks', 0):.0f} / {x['moved_blocks']} | "
                  f"{live['moved_bytes'] / 2**20:.1f} | {x['moved_bytes'] / 2**20:.1f} | {off} | "
                  f"{live.get('failures', 0):.0f} / {x.get('move_failures', 0)} |")
            continue
        label = args.label or "/".join(os.path.normpath(d).split(os.sep)[-2:])
        cells = [label, setup[0], f"{live['hit']:.1%}"]
        cmp = {r: compare(live, res[r][1]) for r in args.replays}
        cells += [f"{res[r][1]['local_hit'] + res[r][1]['remote_hit']:.1%}" for r in args.replays]
        cells += [f"{cmp[r][0]:+.1f}" for r in args.replays]
        live_blocks = live.get("moved_blocks", live["moved_bytes"] / LIVE_BLOCK_BYTES)  # older live.json: bytes only
        cells += [f"{live_blocks:.0f}"] + [f"{res[r][1]['moved_blocks']}" for r in args.replays]
        cells += [ratio_text(live, res[r][1], cmp[r][1]) for r in args.replays]
        cells += [f"{live.get('failures', 0):.0f}"] + [f"{res[r][1].get('move_failures', 0)}" for r in args.replays]
        cells += ["yes" if cmp[r][2] else "no" for r in args.replays]
        print("| " + " | ".join(cells) + " |", flush=True)
        for r in args.replays:
            totals[r][0] += cmp[r][2]
            totals[r][1] += res[r][1]["moved_bytes"]
    if args.format == "compare":
        for r in args.replays:
            print(f"\n{r}: goal met in {totals[r][0]} arm(s); {totals[r][1] / 2**20:.1f} MiB moved in all", file=sys.stderr)


if __name__ == "__main__":
    main()
