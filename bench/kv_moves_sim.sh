#!/usr/bin/env bash
# kv_moves_sim.sh — braid sim's cluster model (issue 19, beyond one machine): hit rate by origin
# (local cache / moved in from another instance / computed) and modeled latency at 4, 16 and 64
# instances on the shared-prefix workloads, cache-aware router vs round-robin, KV moves on vs off.
#   bench/kv_moves_sim.sh OUT
# Environment (defaults in brackets): WORKLOADS [cross-tenant templates], INSTANCES [4 16 64],
# WORKFLOWS [400], CONCURRENCY [64], SEED [21], KV_TOKENS [16384] per instance, LINK_GBPS [10],
# LINK_LATENCY_US [20], BRAID_BIN / BENCH_BIN.
# Writes OUT/<workload>.jsonl (traces from braid-bench gen) and OUT/table.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BENCH_BIN:-$root/build/braid-bench}
out=${1:?usage: bench/kv_moves_sim.sh OUT}
mkdir -p "$out"
WORKLOADS=${WORKLOADS:-cross-tenant templates}
INSTANCES=${INSTANCES:-4 16 64}
WORKFLOWS=${WORKFLOWS:-400}
CONCURRENCY=${CONCURRENCY:-64}
SEED=${SEED:-21}
KV_TOKENS=${KV_TOKENS:-16384}
LINK_GBPS=${LINK_GBPS:-10}
LINK_LATENCY_US=${LINK_LATENCY_US:-20}
{
  echo "Command: bench/kv_moves_sim.sh (WORKLOADS='$WORKLOADS' INSTANCES='$INSTANCES' WORKFLOWS=$WORKFLOWS CONCURRENCY=$CONCURRENCY"
  echo "SEED=$SEED KV_TOKENS=$KV_TOKENS per instance, link $LINK_GBPS GB/s + $LINK_LATENCY_US us a move); $(date -u +%FT%TZ)"
} > "$out/table.md"
fmt='import json, sys
r = json.load(sys.stdin)
pct = lambda k: "{:.1%}".format(r[k])
cells = [r["instances"], r["router"], "on" if r["moves"] else "off", pct("local_hit"), pct("remote_hit"), pct("computed"),
         r["moves_made"], "{:.2f}".format(r["moved_bytes"] / 2**30), "{:.1f}".format(r["mean_latency_s"]), pct("max_share")]
print("| " + " | ".join(str(c) for c in cells) + " |")'
for w in $WORKLOADS; do
  echo "== $w: trace" >&2
  "$bench" gen --workload "$w" --out "$out/$w.jsonl" --workflows "$WORKFLOWS" --concurrency "$CONCURRENCY" --seed "$SEED" 2>&1 | tail -1 >&2
  {
    echo
    echo "### $w"
    echo
    echo "| instances | router | moves | local hit | moved in | computed | moves | GiB moved | mean modeled latency s | busiest instance |"
    echo "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"
  } >> "$out/table.md"
  for n in $INSTANCES; do
    for router in cache balanced round-robin; do
      for moves in on off; do
        "$braid" sim --trace "$out/$w.jsonl" --kv-tokens "$KV_TOKENS" --instances "$n" --router "$router" --moves "$moves" \
          --link-gbps "$LINK_GBPS" --link-latency-us "$LINK_LATENCY_US" --json | tail -1 | python3 -c "$fmt" \
          >> "$out/table.md"
      done
    done
  done
done
cat "$out/table.md"
