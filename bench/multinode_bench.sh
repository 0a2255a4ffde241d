#!/usr/bin/env bash
# multinode_bench.sh — the multi-node throughput benchmark (issue 33 item 5): the cross-tenant,
# codegen and templates workloads on 1, 2 and 4 worker nodes (one instance per node, the coordinator
# on a node of its own), KV moves on and off, at two link rates, on "nodes" that are network
# namespaces of this machine (tests/multinode/nodes.sh; launch/braid-local --nodes). Needs root.
#   bench/multinode_bench.sh OUT
#   ROUTERS="cost cache balanced round-robin" ROUNDS=2 bench/multinode_bench.sh OUT   the router comparison:
#   per workload, node count, moves and rate, ROUNDS interleaved rounds (round r starts at the r-th router
#   of ROUTERS, so each router takes each place in the order; round r uses seed SEED + r - 1, the same for
#   every router of the round), a fresh cluster per arm; writes OUT/routers.md: every arm, and each
#   router's figures as the geometric mean over rounds of its ratio to the first router of ROUTERS in
#   the same round (req/s, TTFT p50 / p99, hit rate, bytes moved), with the load average beside each arm.
#   No simulator rows in this mode. ROUND_FIRST=R [1] numbers the rounds from R, to add rounds to an OUT
#   that has some (OUT/routers.md then covers them all).
#   A word of ROUTERS may be NAME:ROUTER:BINARY (e.g. costfix:cost:/tmp/b/braid): the arm is named NAME, runs
#   --router ROUTER with that braid binary (two builds of one router side by side in the same rounds).
#   ARM_TIMEOUT [1800] (s, every mode): bounds each arm's driver; one that runs past it is reported as a hang.
# Environment (defaults in brackets): WORKLOADS [cross-tenant codegen templates], NODES [1 2 4] (worker
# nodes), MOVES [on off], RATES [1gbit 10gbit] (tc tbf on every link), ROUTER [cost], WORKFLOWS [8],
# CONCURRENCY [4], SCALE [0.5], MAX_TOKENS_CAP [24], KV_BLOCKS [256] per instance, SEED [1],
# SIM_ONLY [0] (1: no live arms; the projection from OUT/live-rate.txt or PREFILL_MS / DECODE_MS), SIM_ITERATIONS [18],
# BRAID_BIN / BENCH_BIN.
# Per live arm: requests/s, TTFT p50/p99 (braid-bench's summary), prompt tokens by origin (local
# device cache, host tier, moved in from another node, computed; the cluster's /metrics) and bytes on
# the wire (what the worker nodes sent: the rx counters of their veths in the root namespace, which
# carry the KV moves and the control messages). One node with moves on runs once (nothing to move).
# Two cores serve every node here, so the live figures measure what moves save, not scale-out; the
# simulator's projection to real nodes (braid sim --instances N, per-node compute from the live
# one-node rate, the same link rate) gives the scale-out. The check of the simulator against each live
# arm replays that arm's own trace (braid-bench run writes what it sent: the prompts' real block
# hashes, send times, real output lengths) with braid sim, the per-token compute calibrated so the
# replay's mean TTFT equals the arm's and the decode cost so its mean first-to-last-token time does (bisection;
# the closed-loop replay: the workflows sent as the arm's client sent them), and sets hit rate and blocks /
# bytes moved side by side (goal: within 2 points and 10 %; bench/sim_vs_live.py, which also compares
# the batching replay with the one-request-at-a-time one over any set of arms). The dry trace of `braid-bench gen` is no
# check: its outputs are not capped at MAX_TOKENS_CAP, so every later turn's prompt differs from the
# live one, and its arrival times are an unloaded server's.
# Writes OUT/table.md (SIM_ONLY=1: OUT/table-sim.md) and OUT/<arm>/: braid-bench results (run/, with the
# trace of what was sent), metrics.txt, wire.txt, events.jsonl (the coordinator's route and move events), serve log.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
nodes_sh=$root/tests/multinode/nodes.sh
out=${1:?usage: bench/multinode_bench.sh OUT}
mkdir -p "$out"
out=$(cd "$out" && pwd)
WORKLOADS=${WORKLOADS:-cross-tenant codegen templates}
NODES=${NODES:-1 2 4}
MOVES=${MOVES:-on off}
RATES=${RATES:-1gbit 10gbit}
ROUTER=${ROUTER:-cost}
WORKFLOWS=${WORKFLOWS:-8}
CONCURRENCY=${CONCURRENCY:-4}
SCALE=${SCALE:-0.5}
MAX_TOKENS_CAP=${MAX_TOKENS_CAP:-24}
KV_BLOCKS=${KV_BLOCKS:-256}
SEED=${SEED:-1}
SIM_ONLY=${SIM_ONLY:-0}
SIM_ITERATIONS=${SIM_ITERATIONS:-18}   # bisection steps of each fit in the simulator check (18 pin each fit within 0.01 %)
ROUTERS=${ROUTERS:-}   # set (e.g. "cost cache balanced round-robin"): the router comparison instead (see compare_routers)
ROUNDS=${ROUNDS:-2}
ROUND_FIRST=${ROUND_FIRST:-1}   # the first round's number: more rounds into an OUT that has some (the table covers every round there)
ARM_TIMEOUT=${ARM_TIMEOUT:-1800}
port=${PORT:-18431}
table=$out/table.md
[ "$SIM_ONLY" = 1 ] && table=$out/table-sim.md # keeps the live tables of an earlier run in OUT
pid=""
cleanup() {
  [ -n "$pid" ] && kill -KILL -- -"$pid" 2> /dev/null
  [ "$SIM_ONLY" = 1 ] || "$nodes_sh" down > /dev/null 2>&1 || true
}
trap cleanup EXIT
metric() { awk -v name="$1" '$1 == name {s += $2} END {print s + 0}' "$2"; }
rate_bits() {  # 10gbit -> 1e10 bits/s
  python3 -c 'import re, sys; m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", sys.argv[1].lower()); print(float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]])' "$1"
}
wire_bytes() {  # bytes the worker nodes 2..K+1 sent into the bridge
  local k=$1 sum=0 v
  for i in $(seq 2 $((k + 1))); do
    v=$("$nodes_sh" veth "$i")
    sum=$((sum + $(cat "/sys/class/net/$v/statistics/rx_bytes")))
  done
  echo "$sum"
}

run_arm() {  # run_arm WORKLOAD K MOVES RATE [TAG] (TAG: the router comparison's ROUTER-rROUND, part of the arm's dir name)
  local w=$1 k=$2 moves=$3 rate=$4 dir="$out/$1-$2n-$3-$4${5:+-$5}"
  rm -rf "$dir"
  mkdir -p "$dir"
  cut -d' ' -f1 /proc/loadavg > "$dir/load.txt"
  local node1 url
  node1=$("$nodes_sh" addr 1)
  url=http://$node1:$port
  echo "== $w, $k worker node(s), moves $moves, links $rate, router $ROUTER, binary $braid" >&2
  BRAID_BIN=$braid setsid "$root/launch/braid-local" --nodes $((k + 1)) --instances "$k" --model "$model" --port "$port" \
    --threads 1 --kv-blocks "$KV_BLOCKS" --router "$ROUTER" --kv-moves "$moves" --events "$dir/events.jsonl" > "$dir/serve.log" 2>&1 &
  pid=$!
  local up=0
  for _ in $(seq 1 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && up=1 && break
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.5
  done
  if [ "$up" != 1 ]; then
    echo "multinode_bench: the cluster did not come up, see $dir/serve.log" >&2
    kill -KILL -- -"$pid" 2> /dev/null || true; wait "$pid" 2> /dev/null || true; pid=""
    return 1
  fi
  local before after
  before=$(wire_bytes "$k")
  local rc=0
  timeout "$ARM_TIMEOUT" "$bench" run --workload "$w" --url "$url" --model "$model" --out "$dir/run" --workflows "$WORKFLOWS" \
    --concurrency "$CONCURRENCY" --scale "$SCALE" --max-tokens-cap "$MAX_TOKENS_CAP" --seed "${6:-$SEED}" > "$dir/run.log" 2>&1 || rc=$?
  [ "$rc" = 124 ] && echo "multinode_bench: the driver ran past ARM_TIMEOUT=$ARM_TIMEOUT s (a hang?), see $dir/run.log" >&2
  [ "$rc" != 0 ] && [ "$rc" != 124 ] && echo "multinode_bench: the driver failed (exit $rc), see $dir/run.log" >&2
  after=$(wire_bytes "$k")
  echo $((after - before)) > "$dir/wire.txt"
  curl -s "$url/metrics" > "$dir/metrics.txt"
  cut -d' ' -f1 /proc/loadavg >> "$dir/load.txt"
  kill -TERM "$pid"
  wait "$pid" || true
  pid=""
}

row() {  # row WORKLOAD K MOVES RATE [TAG]: one line of the live table (+ the numbers sim_check needs, in DIR/live.json)
  local w=$1 k=$2 moves=$3 rate=$4 dir="$out/$1-$2n-$3-$4${5:+-$5}"
  local m=$dir/metrics.txt
  python3 - "$dir" "$k" "$moves" "$rate" "$(cat "$dir/wire.txt")" \
    "$(metric 'braid_prompt_tokens_cached_total{tier="device"}' "$m")" "$(metric 'braid_prompt_tokens_cached_total{tier="host"}' "$m")" \
    "$(metric braid_prompt_tokens_computed_total "$m")" "$(metric braid_kv_moved_in_blocks_total "$m")" \
    "$(metric braid_kv_moved_in_bytes_total "$m")" "$(metric braid_kv_move_failures_total "$m")" <<'PY'
import json, sys
d, k, moves, rate, wire = sys.argv[1:6]
dev, host, computed, moved_blocks, moved_bytes, failures = (float(x) for x in sys.argv[6:12])
s = json.load(open(f"{d}/run/summary.json"))
ttft = s.get("metrics", {}).get("ttft_ms", {})
remote = moved_blocks * 16
total = dev + host + computed or 1
local = dev - remote
json.dump({"hit": (dev + host) / total, "moved_bytes": moved_bytes, "moved_blocks": moved_blocks, "failures": failures, "req_s": s["req_s"],
           "ttft_p50_s": ttft.get("p50", 0) / 1e3, "ttft_p99_s": ttft.get("p99", 0) / 1e3, "ok": s["requests"] - s["errors"],
           "requests": s["requests"], "wire_bytes": int(wire)},
          open(f"{d}/live.json", "w"))
print(f"| {k} | {moves} | {rate} | {s['requests'] - s['errors']}/{s['requests']} | {s['req_s']:.3f} | {ttft.get('p50', 0) / 1e3:.2f} | "
      f"{ttft.get('p99', 0) / 1e3:.2f} | {local / total:.1%} | {remote / total:.1%} | {host / total:.1%} | {computed / total:.1%} | "
      f"{moved_bytes / 2**20:.1f} | {int(wire) / 2**20:.1f} | {failures:.0f} |")
PY
}

# The per-node compute the projection uses: fitted on the first one-node live arm (prefill and
# decode time in the simulator's 1:4 ratio, over the run's wall time: the driver keeps the node busy),
# else PREFILL_MS / DECODE_MS, else braid sim's defaults (2.5 / 10 ms).
fit_rate() {
  local dir=$1
  python3 - "$dir" "$(metric braid_prompt_tokens_computed_total "$dir/metrics.txt")" <<'PY' > "$out/live-rate.txt"
import json, sys
d, computed = sys.argv[1], float(sys.argv[2])
s = json.load(open(f"{d}/run/summary.json"))
generated = s["completion_tokens"]
prefill_ms = s["wall_s"] * 1e3 / (computed + 4 * generated)
print(f"{prefill_ms:.4f} {4 * prefill_ms:.4f}")
PY
}

sim_row() {  # sim_row WORKLOAD K MOVES RATE: the projection (and the check against the live arm when there is one)
  local w=$1 k=$2 moves=$3 rate=$4 prefill decode
  read -r prefill decode < <(cat "$out/live-rate.txt" 2> /dev/null || echo "${PREFILL_MS:-2.5} ${DECODE_MS:-10}")
  [ -s "$out/$w.trace.jsonl" ] || "$bench" gen --workload "$w" --out "$out/$w.trace.jsonl" --workflows "$WORKFLOWS" \
    --concurrency "$CONCURRENCY" --scale "$SCALE" --seed "$SEED" --prefill-ms-per-token "$prefill" --decode-ms-per-token "$decode" 2>&1 | tail -1 >&2
  local gbps
  gbps=$(python3 -c "print($(rate_bits "$rate") / 8e9)")
  local sim
  sim=$("$braid" sim --trace "$out/$w.trace.jsonl" --kv-tokens $((KV_BLOCKS * 16)) --instances "$k" --router "$ROUTER" --moves "$moves" \
    --link-gbps "$gbps" --link-latency-us 100 --prefill-ms-per-token "$prefill" --decode-ms-per-token "$decode" --json | tail -1)
  python3 - "$sim" "$k" "$moves" "$rate" <<'PY'
import json, sys
x = json.loads(sys.argv[1])
k, moves, rate = sys.argv[2:5]
req_s = x["requests"] / x["span_s"] if x["span_s"] > 0 else 0
print(f"| {k} | {moves} | {rate} | {req_s:.3f} | {x['mean_ttft_s']:.2f} | {x['p99_ttft_s']:.2f} | {x['local_hit']:.1%} | "
      f"{x['remote_hit']:.1%} | {x['computed']:.1%} | {x['moved_bytes'] / 2**20:.1f} |")
PY
}

check_row() {  # check_row WORKLOAD K MOVES RATE: braid sim replaying the live arm's own trace, against the live arm
  local dir="$out/$1-$2n-$3-$4"
  [ -s "$dir/run/trace.jsonl" ] && [ -s "$dir/live.json" ] || return 0
  # bench/sim_vs_live.py: the batching replay run as the arm's client ran (batch-closed: --closed-loop, the router
  # starting from serve's default rates), prefill cost fitted to the arm's mean TTFT and decode cost to its mean
  # first-to-last-token time (--fit-decode 1): the replay that matched the live arms best (19 of 27, bench/RESULTS.md
  # "the simulator against the 27 live arms, cause by cause"); SIM_ITERATIONS bisection steps a fit
  python3 "$root/bench/sim_vs_live.py" --braid "$braid" --router "$ROUTER" --kv-blocks "$KV_BLOCKS" --replays batch-closed \
    --fit-decode 1 --iterations "$SIM_ITERATIONS" --format bench "$dir"
}

# The router comparison (ROUTERS set): interleaved rounds over the routers, one table of arms and one of
# ratios to the first router, in OUT/routers.md.
compare_routers() {
  local table=$out/routers.md w rate k moves r i n router tag
  local -a routers names
  read -r -a routers <<< "$ROUTERS"
  n=${#routers[@]}
  for i in $(seq 0 $((n - 1))); do names[i]=${routers[i]%%:*}; done
  {
    echo "Command: ROUTERS='$ROUTERS' ROUNDS=$ROUNDS bench/multinode_bench.sh (WORKLOADS='$WORKLOADS' NODES='$NODES' MOVES='$MOVES'"
    echo "RATES='$RATES' WORKFLOWS=$WORKFLOWS CONCURRENCY=$CONCURRENCY SCALE=$SCALE MAX_TOKENS_CAP=$MAX_TOKENS_CAP KV_BLOCKS=$KV_BLOCKS SEED=$SEED);"
    echo "$(date -u +%FT%TZ); $(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  } > "$table"
  for rate in $RATES; do
    "$nodes_sh" down > /dev/null 2>&1 || true
    "$nodes_sh" up $(( $(echo "$NODES" | tr ' ' '\n' | sort -n | tail -1) + 1 )) --rate "$rate" >&2
    for w in $WORKLOADS; do
      for k in $NODES; do
        for moves in $MOVES; do
          for r in $(seq "$ROUND_FIRST" $((ROUND_FIRST + ROUNDS - 1))); do
            for i in $(seq 0 $((n - 1))); do
              router=${routers[$(( (i + r - 1) % n ))]}
              tag=${router%%:*}-r$r
              local arm_router=$router arm_bin=$braid
              if [[ $router == *:*:* ]]; then arm_router=${router#*:}; arm_bin=${arm_router#*:}; arm_router=${arm_router%%:*}; fi
              braid=$arm_bin ROUTER=$arm_router run_arm "$w" "$k" "$moves" "$rate" "$tag" $((SEED + r - 1)) &&
                row "$w" "$k" "$moves" "$rate" "$tag" > /dev/null || echo "multinode_bench: arm $w $k $moves $rate $tag failed" >&2
            done
          done
        done
      done
    done
    "$nodes_sh" down > /dev/null 2>&1 || true
  done
  python3 - "$out" "$((ROUND_FIRST + ROUNDS - 1))" "$WORKLOADS" "$NODES" "$MOVES" "$RATES" "${names[@]}" <<'PY' >> "$table"
import json, math, os, re, sys
out, rounds = sys.argv[1], int(sys.argv[2])
workloads, nodes, moves_list, rates = (x.split() for x in sys.argv[3:7])
routers = sys.argv[7:]
# every round in OUT, also those of earlier runs (ROUND_FIRST)
rounds = max([rounds] + [int(m[1]) for m in (re.search(r"-r([0-9]+)$", d) for d in os.listdir(out)) if m])
def load(d):
    p = os.path.join(out, d, "live.json")
    if not os.path.exists(p):
        return None
    x = json.load(open(p))
    x["load"] = open(os.path.join(out, d, "load.txt")).read().split()
    return x
def gmean(v):
    v = [x for x in v if x is not None]
    return math.exp(sum(math.log(x) for x in v) / len(v)) if v else None
def ratio(a, b):
    return a / b if a is not None and b not in (None, 0) and a > 0 else None
def fmt(x, f="{:.3f}"):
    return f.format(x) if x is not None else "n/a"
keys = [("req/s", "req_s"), ("TTFT p50", "ttft_p50_s"), ("TTFT p99", "ttft_p99_s"), ("hit", "hit"), ("bytes moved", "moved_bytes")]
for rate in rates:
    for w in workloads:
        for k in nodes:
            for mv in moves_list:
                base = f"{w}-{k}n-{mv}-{rate}"
                print(f"\n### {w}, {k} worker node(s), moves {mv}, links {rate}: every arm (run order within a round rotates)\n")
                print("| round | router | ok/requests | req/s | TTFT p50 s | TTFT p99 s | hit | MiB moved | MiB on the wire | failed moves | load start / end |")
                print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
                arms = {}
                for r in range(1, rounds + 1):
                    if not any(os.path.isdir(os.path.join(out, f"{base}-{rt}-r{r}")) for rt in routers):
                        continue  # a round not run into this OUT
                    for rt in routers:
                        x = load(f"{base}-{rt}-r{r}")
                        arms[(rt, r)] = x
                        if x is None:
                            print(f"| {r} | {rt} | failed | | | | | | | | |")
                            continue
                        print(f"| {r} | {rt} | {x['ok']}/{x['requests']} | {x['req_s']:.3f} | {x['ttft_p50_s']:.2f} | {x['ttft_p99_s']:.2f} | "
                              f"{x['hit']:.1%} | {x['moved_bytes'] / 2**20:.1f} | {x['wire_bytes'] / 2**20:.1f} | {x['failures']:.0f} | {' / '.join(x['load'])} |")
                print(f"\n{w}, {k} worker node(s), moves {mv}, links {rate}: ratio to {routers[0]} (geometric mean over the rounds of each round's ratio; "
                      f"req/s and hit: higher is better, TTFT and bytes: lower)\n")
                print("| router | " + " | ".join(name for name, _ in keys) + " | MiB moved, mean per arm | rounds |")
                print("|---|" + "---:|" * len(keys) + "---:|---:|")
                for rt in routers:
                    cells = []
                    paired = [r for r in range(1, rounds + 1) if arms.get((rt, r)) and arms.get((routers[0], r))]
                    for name, key in keys:
                        v = [ratio(arms[(rt, r)][key], arms[(routers[0], r)][key]) for r in paired]
                        defined = [x for x in v if x is not None]
                        # a ratio is undefined where either side is 0 (e.g. nothing moved): say over how many rounds it is
                        cells.append(fmt(gmean(defined)) + (f" ({len(defined)}/{len(paired)})" if len(defined) < len(paired) else ""))
                    mib = [arms[(rt, r)]["moved_bytes"] / 2**20 for r in paired]
                    print(f"| {rt} | " + " | ".join(cells) + f" | {sum(mib) / len(mib) if mib else 0:.1f} | {len(paired)} |")
PY
  cat "$table"
}
if [ -n "$ROUTERS" ]; then
  compare_routers
  exit 0
fi

{
  echo "Command: bench/multinode_bench.sh (WORKLOADS='$WORKLOADS' NODES='$NODES' MOVES='$MOVES' RATES='$RATES' ROUTER=$ROUTER"
  echo "WORKFLOWS=$WORKFLOWS CONCURRENCY=$CONCURRENCY SCALE=$SCALE MAX_TOKENS_CAP=$MAX_TOKENS_CAP KV_BLOCKS=$KV_BLOCKS SEED=$SEED);"
  echo "$(date -u +%FT%TZ); $(nproc) cores; load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$table"
for w in $WORKLOADS; do
  if [ "$SIM_ONLY" != 1 ]; then
    {
      echo
      echo "### $w, live (worker nodes = network namespaces on this machine, one instance each)"
      echo
      echo "| worker nodes | moves | links | ok/requests | req/s | TTFT p50 s | TTFT p99 s | local | remote | host | computed | MiB moved | MiB on the wire | failed moves |"
      echo "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    } >> "$table"
    for rate in $RATES; do
      "$nodes_sh" down > /dev/null 2>&1 || true
      "$nodes_sh" up $(( $(echo "$NODES" | tr ' ' '\n' | sort -n | tail -1) + 1 )) --rate "$rate" >&2
      for k in $NODES; do
        for moves in $MOVES; do
          [ "$k" = 1 ] && [ "$moves" = on ] && [ "$(echo "$MOVES" | wc -w)" -gt 1 ] && continue # one instance: nothing to move
          if run_arm "$w" "$k" "$moves" "$rate"; then
            row "$w" "$k" "$moves" "$rate" >> "$table"
            if [ "$k" = 1 ] && [ ! -s "$out/live-rate.txt" ]; then fit_rate "$out/$w-${k}n-$moves-$rate"; fi
          fi
        done
      done
      "$nodes_sh" down > /dev/null 2>&1 || true
    done
  fi
  if ls "$out/$w"-*n-*/run/trace.jsonl > /dev/null 2>&1; then
    {
      echo
      echo "### $w, the simulator against the live arms (braid sim replaying each arm's own trace in closed loop: the requests as"
      echo "sent, each workflow's next stage when the one before it answered, their real outputs; prefill cost a token fitted so the"
      echo "replay's mean TTFT is the arm's, decode cost so its mean first-to-last-token time is)"
      echo
      echo "| worker nodes | moves | links | fitted prefill ms/token | TTFT mean s live / sim | hit live | hit sim | points | blocks moved live / sim | MiB moved live | MiB moved sim | bytes sim vs live | failed moves live / sim |"
      echo "|---:|---|---|---:|---|---:|---:|---:|---|---:|---:|---:|---|"
    } >> "$table"
    for rate in $RATES; do
      for k in $NODES; do
        for moves in $MOVES; do
          # a failed check (e.g. braid sim refusing an option) costs its row, not the projection after it
          check_row "$w" "$k" "$moves" "$rate" >> "$table" || echo "multinode_bench: the simulator check of $w-${k}n-$moves-$rate failed" >&2
        done
      done
    done
  fi
  {
    echo
    echo "### $w, simulator projection to real nodes (braid sim --instances N, per-node compute: $(cat "$out/live-rate.txt" 2> /dev/null || echo "${PREFILL_MS:-2.5} ${DECODE_MS:-10}") ms prefill / decode per token)"
    echo
    echo "| nodes | moves | links | req/s | TTFT mean s | TTFT p99 s | local | remote | computed | MiB moved |"
    echo "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"
  } >> "$table"
  for rate in $RATES; do
    for k in $NODES; do
      for moves in $MOVES; do
        sim_row "$w" "$k" "$moves" "$rate" >> "$table"
      done
    done
  done
done
cat "$table"
