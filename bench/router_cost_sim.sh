#!/usr/bin/env bash
# router_cost_sim.sh — the cost router (--router cost, the default) against the baselines (cache,
# balanced, round-robin) in braid sim's cluster model (issue 33 item 4): mean / p50 / p99 modeled
# latency, mean TTFT, computed prompt tokens and bytes moved at 4, 16 and 64 instances, KV moves on.
#   bench/router_cost_sim.sh OUT
# Environment (defaults in brackets): WORKLOADS [cross-tenant templates codegen], INSTANCES [4 16 64],
# ROUTERS [cost cache balanced round-robin], WORKFLOWS [400], CONCURRENCY [64] (workflows active at
# once; the same trace for every cluster size), SEEDS [21] (one trace per seed and workload; with
# several, a last table gives cost's ratio to the best baseline per seed), KV_TOKENS [16384] per instance,
# LINK_GBPS [10] (GB/s), LINK_LATENCY_US [20], MOVES [on], BRAID_BIN / BENCH_BIN.
# Writes OUT/<workload>-s<seed>.jsonl (traces from braid-bench gen), OUT/<workload>-s<seed>-<n>-<router>.json
# (one braid sim --json line each) and OUT/table.md; the last column says whether the cost router's mean
# and p99 both beat (<) every baseline's at that size. Progress on stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BENCH_BIN:-$root/build/braid-bench}
out=${1:?usage: bench/router_cost_sim.sh OUT}
mkdir -p "$out"
WORKLOADS=${WORKLOADS:-cross-tenant templates codegen}
INSTANCES=${INSTANCES:-4 16 64}
ROUTERS=${ROUTERS:-cost cache balanced round-robin}
WORKFLOWS=${WORKFLOWS:-400}
CONCURRENCY=${CONCURRENCY:-64}
SEEDS=${SEEDS:-21}
KV_TOKENS=${KV_TOKENS:-16384}
LINK_GBPS=${LINK_GBPS:-10}
LINK_LATENCY_US=${LINK_LATENCY_US:-20}
MOVES=${MOVES:-on}
{
  echo "Command: bench/router_cost_sim.sh (WORKLOADS='$WORKLOADS' INSTANCES='$INSTANCES' WORKFLOWS=$WORKFLOWS"
  echo "CONCURRENCY=$CONCURRENCY SEEDS='$SEEDS' KV_TOKENS=$KV_TOKENS per instance, moves $MOVES, link $LINK_GBPS GB/s + $LINK_LATENCY_US us a move);"
  echo "$(date -u +%FT%TZ); $(uname -m), $(nproc) cores"
} > "$out/table.md"
for seed in $SEEDS; do
  for w in $WORKLOADS; do
    echo "== $w, seed $seed: trace" >&2
    [ -s "$out/$w-s$seed.jsonl" ] || "$bench" gen --workload "$w" --out "$out/$w-s$seed.jsonl" --workflows "$WORKFLOWS" \
      --concurrency "$CONCURRENCY" --seed "$seed" 2>&1 | tail -1 >&2
    for n in $INSTANCES; do
      for router in $ROUTERS; do
        "$braid" sim --trace "$out/$w-s$seed.jsonl" --kv-tokens "$KV_TOKENS" --instances "$n" --router "$router" --moves "$MOVES" \
          --link-gbps "$LINK_GBPS" --link-latency-us "$LINK_LATENCY_US" --json | tail -1 > "$out/$w-s$seed-$n-$router.json"
      done
    done
  done
done
python3 - "$out" "$WORKLOADS" "$INSTANCES" "$ROUTERS" "$SEEDS" >> "$out/table.md" <<'PY'
import json, sys
out, workloads, instances, routers, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), sys.argv[4].split(), sys.argv[5].split()
for seed in seeds:
  for w in workloads:
    print(f"\n### {w}, seed {seed}\n")
    print("| instances | router | mean latency s | p50 s | p99 s | mean TTFT s | local hit | moved in | computed | computed tokens | GiB moved | busiest | cost beats all (mean, p99) |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n in instances:
        rows = {r: json.load(open(f"{out}/{w}-s{seed}-{n}-{r}.json")) for r in routers}
        verdict = ""
        if "cost" in rows and len(rows) > 1:
            c = rows["cost"]
            others = [rows[r] for r in routers if r != "cost"]
            beats_mean = all(c["mean_latency_s"] < o["mean_latency_s"] for o in others)
            beats_p99 = all(c["p99_latency_s"] < o["p99_latency_s"] for o in others)
            best_mean = min(o["mean_latency_s"] for o in others)
            best_p99 = min(o["p99_latency_s"] for o in others)
            verdict = (f"{'yes' if beats_mean else 'no'} ({c['mean_latency_s'] / best_mean:.3f}x best), "
                       f"{'yes' if beats_p99 else 'no'} ({c['p99_latency_s'] / best_p99:.3f}x best)")
        for r in routers:
            x = rows[r]
            pct = lambda k: f"{x[k]:.1%}"
            cells = [n, r, f"{x['mean_latency_s']:.2f}", f"{x['p50_latency_s']:.2f}", f"{x['p99_latency_s']:.2f}",
                     f"{x['mean_ttft_s']:.2f}", pct("local_hit"), pct("remote_hit"), pct("computed"), x["computed_tokens"],
                     f"{x['moved_bytes'] / 2**30:.2f}", pct("max_share"), verdict if r == "cost" else ""]
            print("| " + " | ".join(str(c) for c in cells) + " |")
if "cost" in routers and len(routers) > 1 and len(seeds) > 1:
    print("\n### cost / best baseline, per seed (mean latency, p99 latency; < 1: cost is better)\n")
    print("| workload | instances | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    print("|---|---:|" + "---|" * len(seeds))
    for w in workloads:
        for n in instances:
            cells = []
            for seed in seeds:
                rows = {r: json.load(open(f"{out}/{w}-s{seed}-{n}-{r}.json")) for r in routers}
                base = [rows[r] for r in routers if r != "cost"]
                cells.append(f"{rows['cost']['mean_latency_s'] / min(b['mean_latency_s'] for b in base):.3f}, "
                             f"{rows['cost']['p99_latency_s'] / min(b['p99_latency_s'] for b in base):.3f}")
            print(f"| {w} | {n} | " + " | ".join(cells) + " |")
PY
cat "$out/table.md"
