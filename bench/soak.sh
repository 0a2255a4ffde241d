#!/usr/bin/env bash
# bench/soak.sh — a bounded soak run (issue 22, point 5): a local cluster under mixed agent
# workloads at a fixed concurrency for a fixed time, with every rank's RSS and the KV pools'
# occupancy sampled into a CSV, and a summary (does RSS plateau?) appended to bench/RESULTS.md.
#
#   bench/soak.sh [--minutes M] [--concurrency C] [--instances I] [--interval S] [--out DIR] [--no-results]
#                 [-- braid serve options...]
#
# Defaults: 20 minutes, concurrency 64, 2 instances, a sample every 10 s, DIR runs/soak-<UTC time>.
# The concurrency is split over four workloads run side by side through braid-bench run (codegen,
# factcheck, pipeline, cross-tenant), each restarted with a new seed whenever it finishes, until
# the time is up. Writes DIR/samples.csv (t_s, requests_total, inflight, device/host blocks used and
# total, then rss_kb_rank0.. per MPI rank), DIR/summary.txt, the drivers' runs and the server log.
# "Plateau": the last quarter of the run adds less than 5% (and less than 20 MB) to each rank's
# RSS at the end of the first quarter.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=20 concurrency=64 instances=2 interval=10 out="" write_results=1
serve_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --instances) instances=$2; shift 2 ;;
    --interval) interval=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-results) write_results=0; shift ;;
    --) shift; serve_args=("$@"); break ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${out:-runs/soak-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
workloads=(codegen factcheck pipeline cross-tenant)
per_workload=$(( (concurrency + ${#workloads[@]} - 1) / ${#workloads[@]} ))

launcher="" drivers=()
stop_all() {
  for p in "${drivers[@]+"${drivers[@]}"}"; do kill -TERM "$p" 2> /dev/null || true; done
  [ -n "$launcher" ] && { kill -TERM "$launcher" 2> /dev/null || true; wait "$launcher" 2> /dev/null || true; }
}
trap stop_all EXIT

BRAID_BIN=$PWD/build/braid launch/braid-local --model "$model" --instances "$instances" --port "$port" \
  "${serve_args[@]+"${serve_args[@]}"}" > "$out/serve.log" 2>&1 &
launcher=$!
for _ in $(seq 1 240); do curl -sf "$url/health" > /dev/null && break; sleep 0.5; done
curl -sf "$url/health" > /dev/null || { echo "soak.sh: the cluster did not come up; see $out/serve.log" >&2; exit 1; }

# The ranks of this cluster, in MPI rank order (rank 0 = coordinator).
rank_pids() {
  for pid in $(pgrep -f "braid serve .*--port $port" || true); do
    rank=$(tr '\0' '\n' < "/proc/$pid/environ" 2> /dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ -n "$rank" ] && echo "$rank $pid"
  done | sort -n
}
metric_sum() { awk -v name="$1" '{n = $1; sub(/\{.*/, "", n)} n == name {s += $2} END {print s + 0}' "$2"; }

end=$(( $(date +%s) + minutes * 60 ))
# One driver loop per workload: a run of many workflows, again with the next seed, until the end
# (a run still going then is stopped; what it finished is in its requests.jsonl).
drive() {
  local workload=$1 seed=1
  while [ "$(date +%s)" -lt "$end" ]; do
    timeout $((end - $(date +%s) + 1)) build/braid-bench run --workload "$workload" --url "$url" --model "$model" --workflows $((per_workload * 4)) \
      --concurrency "$per_workload" --seed "$seed" --out "$out/runs/$workload-$seed" --no-trace --max-tokens-cap 64 \
      > "$out/runs.$workload.log" 2>&1 || echo "run $workload seed $seed failed" >> "$out/driver-errors.log"
    seed=$((seed + 1))
  done
}
mkdir -p "$out/runs"
for w in "${workloads[@]}"; do drive "$w" & drivers+=($!); done

n_ranks=$(rank_pids | wc -l)
{
  printf 't_s,requests_total,inflight,device_blocks_used,device_blocks_total,host_blocks_used,host_blocks_total'
  for r in $(seq 0 $((n_ranks - 1))); do printf ',rss_kb_rank%d' "$r"; done
  echo
} > "$out/samples.csv"
start=$(date +%s)
while [ "$(date +%s)" -lt "$end" ]; do
  curl -s --max-time 5 "$url/metrics" > "$out/metrics.txt" || true
  row="$(( $(date +%s) - start ))"
  for m in braid_requests_total braid_requests_inflight braid_instance_kv_blocks_used braid_instance_kv_blocks_total \
           braid_instance_host_kv_blocks_used braid_instance_host_kv_blocks_total; do
    row="$row,$(metric_sum "$m" "$out/metrics.txt")"
  done
  while read -r _ pid; do row="$row,$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2> /dev/null || echo)"; done < <(rank_pids)
  echo "$row" >> "$out/samples.csv"
  sleep "$interval"
done
for p in "${drivers[@]}"; do wait "$p" 2> /dev/null || true; done
drivers=()
curl -s "$url/metrics" > "$out/metrics.txt" || true

# ---- summary: RSS per rank at the end of the first quarter vs the end, and the last quarter's growth
python3 - "$out" "$minutes" "$concurrency" "$instances" > "$out/summary.txt" <<'EOF'
import csv, re, sys
out, minutes, conc, inst = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = list(csv.DictReader(open(f"{out}/samples.csv")))
ranks = [k for k in rows[0] if k.startswith("rss_kb_rank")] if rows else []
n = len(rows)
q1, q3 = rows[max(0, n // 4 - 1)], rows[max(0, 3 * n // 4 - 1)]
ok = True
# Requests the server finished, by status, from its last /metrics (the drivers' runs still going at
# the end are stopped, which the server counts as 499: client gone).
by_status = {}
for line in open(f"{out}/metrics.txt"):
    m = re.match(r'braid_requests_total\{.*status="(\d+)"\} (\S+)', line)
    if m:
        by_status[m.group(1)] = by_status.get(m.group(1), 0) + float(m.group(2))
statuses = ", ".join(f"{k}: {v:.0f}" for k, v in sorted(by_status.items())) or "none"
print(f"soak: {minutes} min, concurrency {conc}, {inst} instances, {n} samples; requests finished by status: {statuses}")
print(f"device blocks used: max {max(float(r['device_blocks_used']) for r in rows):.0f} of {rows[-1]['device_blocks_total']}, "
      f"at the end {rows[-1]['device_blocks_used']}; host blocks used at the end {rows[-1]['host_blocks_used']} of {rows[-1]['host_blocks_total']}")
print("rank  rss_first_MB  rss_q1_MB  rss_q3_MB  rss_end_MB  rss_max_MB  last_quarter_growth")
for k in ranks:
    vals = [float(r[k]) for r in rows if r[k]]
    first, a, b, end = float(rows[0][k]) / 1024, float(q1[k]) / 1024, float(q3[k]) / 1024, vals[-1] / 1024
    growth = end - b
    plateau = growth < max(0.05 * a, 0) and growth < 20
    ok &= plateau
    print(f"{k[len('rss_kb_rank'):]:>4}  {first:12.1f}  {a:9.1f}  {b:9.1f}  {end:10.1f}  {max(vals) / 1024:10.1f}  "
          f"{growth:+.1f} MB ({'plateau' if plateau else 'GROWING'})")
print("verdict:", "RSS plateaus on every rank" if ok else "RSS still grows on some rank")
EOF
cat "$out/summary.txt"
if [ "$write_results" = 1 ]; then
  {
    echo
    echo "### Soak run, $(date -u +%Y-%m-%d) (bench/soak.sh)"
    echo
    echo "Command: \`bench/soak.sh --minutes $minutes --concurrency $concurrency --instances $instances${serve_args[*]+ -- ${serve_args[*]}}\`;" \
      "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'))," \
      "$(awk '/MemTotal/ {printf "%.0f GB", $2 / 1048576}' /proc/meminfo) RAM; CPU backend, the default model."
    echo
    echo '```'
    cat "$out/summary.txt"
    echo '```'
  } >> bench/RESULTS.md
fi
