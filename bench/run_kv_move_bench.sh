#!/usr/bin/env bash
# KV block moves over UCX (bench_kv_move, src/transport/kv_mover) beside UCX's own ucx_perftest
# ucp_get at the same message sizes, per UCX transport setting:
#   [ROUNDS=3] [TLS_LIST="tcp sm"] [BLOCKS=16,64,256] [LARGE_MIB=64] bench/run_kv_move_bench.sh [BUILD_DIR]
#   TABLE_FROM="DIR1 DIR2 ..." bench/run_kv_move_bench.sh   (the table of earlier runs' raw rows, together)
# bench_kv_move runs under mpirun with 2 ranks (owner + reader; see its header for the moves);
# ucx_perftest runs as a server/client pair on localhost with endpoint error handling (-e), which
# is what the mover uses (peer error handling), 6 KiB gets with 1024 outstanding and one large get.
# Each round runs everything once for every UCX_TLS; the table gives each figure's best round
# (noise on a shared machine only ever slows a run down) and ratio = bench / perftest.
# Raw rows go to $OUT (default /tmp/braid-kv-move-bench). Needs BUILD_DIR/bench_kv_move
# (nice -n 19 make -C build bench_kv_move) and ucx_perftest (apt: ucx-utils).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${ROUNDS:-3}
tls_list=${TLS_LIST:-tcp sm}
blocks=${BLOCKS:-16,64,256}
large_mib=${LARGE_MIB:-64}
out=${OUT:-/tmp/braid-kv-move-bench}
port=${PORT:-13500}
table() { # DIR... → the markdown table over the raw rows of every DIR
python3 - "$tls_list" "$@" << 'EOF'
import json, sys
tls_list, dirs = sys.argv[1].split(), sys.argv[2:]
rows = [json.loads(l) for d in dirs for l in open(f"{d}/bench.jsonl") if l.strip()]
pt = [json.loads(l) for d in dirs for l in open(f"{d}/perftest.jsonl") if l.strip()]
GB = 1e9
def best_bench(tls, mode, blocks):
    r = [x for x in rows if x.get("tls") == tls and x.get("mode") == mode and x.get("blocks") == blocks]
    return min(r, key=lambda x: x["seconds"]) if r else None
def best_pt(tls, name):
    r = [x for x in pt if x["tls"] == tls and x["name"] == name and "mib_per_s" in x]
    return max(r, key=lambda x: x["mib_per_s"]) if r else None
def pt_err(tls, name):
    r = [x.get("error") for x in pt if x["tls"] == tls and x["name"] == name and "error" in x]
    return r[0] if r else "no result"
print("| UCX_TLS | move | gets | bench_kv_move blocks/s | bench_kv_move GB/s | ucx_perftest ucp_get GB/s (same size) | ratio |")
print("|---|---|---:|---:|---:|---:|---:|")
for tls in tls_list:
    errs = [x["error"] for x in rows if x.get("tls") == tls and "error" in x]
    modes = sorted({(x["mode"], x["blocks"]) for x in rows if x.get("tls") == tls and "mode" in x},
                   key=lambda mb: (["per_block", "coalesced", "run", "large", "get_6k"].index(mb[0]), mb[1]))
    p6, pl = best_pt(tls, "get_6k_window"), best_pt(tls, "get_large")
    if not modes:
        p6s = f"{p6['mib_per_s'] * 2**20 / GB:.3f}" if p6 else f"n/a ({pt_err(tls, 'get_6k_window')})"
        print(f"| {tls} | (all) | | n/a ({errs[0] if errs else 'no result'}) | | 6 KiB: {p6s} | |")
    for mode, blocks in modes:
        b = best_bench(tls, mode, blocks)
        gbs = b["bytes"] / b["seconds"] / GB
        ref = p6 if mode == "per_block" else pl if mode == "large" else None
        name = {"per_block": f"{blocks} blocks, 60 gets of 6 KiB each", "coalesced": f"{blocks} blocks, consecutive ids merged",
                "run": f"{blocks} consecutive blocks, 60 gets of {blocks * 6} KiB", "large": f"one get of {b['bytes'] >> 20} MiB",
                "get_6k": f"one 6 KiB get alone ({b['us_per_get']:.0f} us)"}[mode]
        refs = f"{ref['mib_per_s'] * 2**20 / GB:.3f}" if ref else ""
        ratio = f"{gbs / (ref['mib_per_s'] * 2**20 / GB):.2f}" if ref else ""
        bps = f"{b['blocks_per_s']:.0f}" if blocks else ""
        print(f"| {tls} | {name} | {b['gets']} | {bps} | {gbs:.3f} | {refs} | {ratio} |")
    ne = best_pt(tls, "get_6k_window_noerr")
    if ne:
        print(f"| {tls} | ucx_perftest without error handling, 6 KiB (reference) | | | | {ne['mib_per_s'] * 2**20 / GB:.3f} | |")
EOF
}
if [ -n "${TABLE_FROM:-}" ]; then
  # shellcheck disable=SC2086
  table $TABLE_FROM
  exit 0
fi
[ -x "$build/bench_kv_move" ] || { echo "no $build/bench_kv_move: nice -n 19 make -C $build bench_kv_move" >&2; exit 1; }
command -v ucx_perftest > /dev/null || { echo "no ucx_perftest: apt-get install ucx-utils" >&2; exit 1; }
mkdir -p "$out"
rm -f "$out"/*.jsonl "$out"/*.log
echo "[bench] $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load average $(cut -d' ' -f1-3 /proc/loadavg), $(ucx_info -v | head -1 | sed 's/# *//')" >&2

# perftest TLS NAME SIZE ITERS [flags...]: one ucx_perftest ucp_get pair; appends
# {"tls","name","size","mib_per_s","us_p50"} (or "error") to perftest.jsonl.
perftest() {
  local tls=$1 name=$2 size=$3 iters=$4
  shift 4
  port=$((port + 1))
  UCX_TLS=$tls timeout 120 ucx_perftest -p "$port" >> "$out/perftest_server.log" 2>&1 &
  local server=$!
  for _ in $(seq 50); do
    ss -ltn 2> /dev/null | grep -q ":$port " && break
    sleep 0.1
  done
  local log="$out/perftest_client_$port.log" line
  UCX_TLS=$tls timeout 120 ucx_perftest localhost -p "$port" -t ucp_get -s "$size" -n "$iters" -w $((iters / 10 + 1)) \
    "$@" -f > "$log" 2>&1 || true
  for _ in $(seq 50); do # the server ends with the client's test; never wait on one that does not
    kill -0 "$server" 2> /dev/null || break
    sleep 0.1
  done
  kill "$server" 2> /dev/null || true
  wait "$server" 2> /dev/null || true
  # -f prints: iterations, latency p50 / average / overall (us), bandwidth average / overall (MB/s = 2^20 B/s), rates
  # (a column can read "inf" when a window of iterations took no time at the timer's resolution)
  line=$(awk 'NF >= 8 && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9.]+$/ && $6 ~ /^[0-9.]+$/' "$log" | tail -1)
  if [ -n "$line" ]; then
    echo "$line" | awk -v t="$tls" -v n="$name" -v s="$size" '{printf "{\"tls\":\"%s\",\"name\":\"%s\",\"size\":%s,\"mib_per_s\":%s,\"us_p50\":%s}\n", t, n, s, $6, $2}' >> "$out/perftest.jsonl"
  else
    local why
    why=$(grep -h -o 'Failed to run test: [A-Za-z ]*' "$log" | tail -1 || true)
    printf '{"tls":"%s","name":"%s","size":%s,"error":"%s"}\n' "$tls" "$name" "$size" "${why:-failed}" >> "$out/perftest.jsonl"
  fi
}

for r in $(seq "$rounds"); do
  for tls in $tls_list; do
    echo "[bench] round $r, UCX_TLS=$tls" >&2
    if ! mpirun --allow-run-as-root --oversubscribe -n 2 -x UCX_TLS="$tls" "$build/bench_kv_move" --blocks "$blocks" \
        --repeats 3 --large-mib "$large_mib" > "$out/bench_$tls.out" 2>> "$out/bench_$tls.log"; then
      why=$(grep -h -o 'kv_mover: [^"]*' "$out/bench_$tls.log" | tail -1 || true)
      printf '{"tls":"%s","error":"%s"}\n' "$tls" "${why:-bench_kv_move failed}" >> "$out/bench.jsonl"
    fi
    # UCX logs to stdout: keep the JSON lines only
    grep '^{"mode"' "$out/bench_$tls.out" | sed "s/^{/{\"tls\":\"$tls\",/" >> "$out/bench.jsonl" || true
    perftest "$tls" get_6k_window 6144 20000 -e -O 1024
    perftest "$tls" get_large $((large_mib << 20)) 20 -e
    # Without endpoint error handling, for reference: shared memory is only usable this way on UCX 1.13.
    [ "$tls" = tcp ] || perftest "$tls" get_6k_window_noerr 6144 20000 -O 1024
  done
done

table "$out"
