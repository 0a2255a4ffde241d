#!/usr/bin/env bash
# kv_moves_live.sh — multi-instance throughput on this machine (issue 19): 1, 2 and 4 one-rank CPU
# instances on the cross-tenant and codegen workloads, KV moves on vs off, the cache-aware router vs
# round-robin, arms back to back in one run.
#   bench/kv_moves_live.sh OUT
# Environment (defaults in brackets): WORKLOADS [cross-tenant codegen], INSTANCES [1 2 4],
# ARMS [cache:on cache:off balanced:on balanced:off round-robin:on round-robin:off] (router:moves; one instance runs the first
# only), WORKFLOWS [8], CONCURRENCY [4], SCALE [0.5], MAX_TOKENS_CAP [24], KV_BLOCKS [256] per
# instance, UCX_TLS (the transport; default UCX's choice), BRAID_BIN / BENCH_BIN (frozen binaries).
# Writes OUT/<workload>-<n>-<router>-<moves>/ (braid-bench run results + metrics.txt), server logs,
# and OUT/table.md: requests/s, prompt tokens by where their K/V came from (local cache, moved in
# from another instance, computed), blocks and bytes moved, failed moves. Progress on stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
bench=${BENCH_BIN:-$root/build/braid-bench}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:?usage: bench/kv_moves_live.sh OUT}
mkdir -p "$out"
WORKLOADS=${WORKLOADS:-cross-tenant codegen}
INSTANCES=${INSTANCES:-1 2 4}
ARMS=${ARMS:-cache:on cache:off balanced:on balanced:off round-robin:on round-robin:off}
WORKFLOWS=${WORKFLOWS:-8}
CONCURRENCY=${CONCURRENCY:-4}
SCALE=${SCALE:-0.5}
MAX_TOKENS_CAP=${MAX_TOKENS_CAP:-24}
KV_BLOCKS=${KV_BLOCKS:-256}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
pid=""
trap '[ -n "$pid" ] && kill -KILL -- -"$pid" 2> /dev/null || true' EXIT
metric() { awk -v name="$1" '$1 == name {s += $2} END {print s + 0}' "$2"; }

run_arm() {  # run_arm WORKLOAD N ROUTER MOVES
  local w=$1 n=$2 router=$3 moves=$4 dir="$out/$1-$2-$3-$4"
  rm -rf "$dir"
  echo "== $w, $n instance(s), router $router, moves $moves" >&2
  BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --instances "$n" --threads 1 \
    --kv-blocks "$KV_BLOCKS" --router "$router" --kv-moves "$moves" > "$out/$w-$n-$router-$moves.serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 600); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && break; sleep 0.5; done
  "$bench" run --workload "$w" --url "$url" --model "$model" --out "$dir" --workflows "$WORKFLOWS" --concurrency "$CONCURRENCY" \
    --scale "$SCALE" --max-tokens-cap "$MAX_TOKENS_CAP" --no-trace > "$out/$w-$n-$router-$moves.run.log" 2>&1 ||
    echo "kv_moves_live: the driver failed, see $out/$w-$n-$router-$moves.run.log" >&2
  curl -s "$url/metrics" > "$dir/metrics.txt"
  kill -TERM "$pid"
  wait "$pid" || true
  pid=""
}

row() {  # row WORKLOAD N ROUTER MOVES: one line of the table
  local w=$1 n=$2 router=$3 moves=$4 dir="$out/$1-$2-$3-$4"
  local m=$dir/metrics.txt
  python3 - "$dir" "$n" "$router" "$moves" \
    "$(metric 'braid_prompt_tokens_cached_total{tier="device"}' "$m")" "$(metric 'braid_prompt_tokens_cached_total{tier="host"}' "$m")" \
    "$(metric braid_prompt_tokens_computed_total "$m")" "$(metric braid_kv_moved_in_blocks_total "$m")" \
    "$(metric braid_kv_moved_in_bytes_total "$m")" "$(metric braid_kv_move_failures_total "$m")" <<'PY'
import json, sys
d, n, router, moves = sys.argv[1:5]
dev, host, computed, moved_blocks, moved_bytes, failures = (float(x) for x in sys.argv[5:11])
reqs = [json.loads(l) for l in open(f"{d}/requests.jsonl")]
ok = [r for r in reqs if r.get("status") == 200]
span = max(r["t_send_s"] + r["latency_ms"] / 1000 for r in ok) - min(r["t_send_s"] for r in ok)
remote = moved_blocks * 16
total = dev + host + computed
local = dev + host - remote
print(f"| {n} | {router} | {moves} | {len(ok)}/{len(reqs)} | {len(ok) / span:.3f} | {local / total:.1%} | {remote / total:.1%} | "
      f"{computed / total:.1%} | {moved_blocks:.0f} | {moved_bytes / 2**20:.1f} | {failures:.0f} |")
PY
}

{
  echo "Command: bench/kv_moves_live.sh (WORKLOADS='$WORKLOADS' INSTANCES='$INSTANCES' WORKFLOWS=$WORKFLOWS CONCURRENCY=$CONCURRENCY"
  echo "SCALE=$SCALE MAX_TOKENS_CAP=$MAX_TOKENS_CAP KV_BLOCKS=$KV_BLOCKS UCX_TLS=${UCX_TLS:-default}); $(date -u +%FT%TZ); $(nproc) cores"
} > "$out/table.md"
for w in $WORKLOADS; do
  {
    echo
    echo "### $w"
    echo
    echo "| instances | router | moves | ok/requests | req/s | local hit | remote hit | computed | blocks moved | MiB moved | failed moves |"
    echo "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  } >> "$out/table.md"
  for n in $INSTANCES; do
    for arm in $ARMS; do
      router=${arm%%:*} moves=${arm#*:}
      run_arm "$w" "$n" "$router" "$moves"
      row "$w" "$n" "$router" "$moves" >> "$out/table.md"
      [ "$n" = 1 ] && break # one instance: routers and moves have nothing to choose
    done
  done
done
cat "$out/table.md"
