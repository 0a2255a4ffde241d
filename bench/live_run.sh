# bench/live_run.sh — sourced by the live benchmark scripts: one driver run against a fresh local
# cluster, and reading a counter from its /metrics.
#   live_run DIR LOG_PREFIX WORKLOAD "DRIVER_ARGS" SERVE_ARGS...
#     starts launch/braid-local --model $model --instances 1 --port $port SERVE_ARGS..., waits for it,
#     runs braid-bench run --workload WORKLOAD DRIVER_ARGS --out DIR, saves DIR/metrics.txt, stops
#     the cluster and waits until it is gone (so the next run can take the port). Needs $model and
#     $port. The logs go to LOG_PREFIX.serve.log and LOG_PREFIX.run.log. BENCH_BIN (default
#     build/braid-bench) and BRAID_BIN (launch/braid-local's) let a long run use frozen copies of the
#     binaries while the tree is rebuilt.
#   metric NAME FILE: the sum of NAME's samples in a Prometheus text file (0 when absent).

metric() { awk -v name="$1" '$1 == name {s += $2} END {print s + 0}' "$2"; }

live_run() {
  local dir=$1 log=$2 workload=$3 driver_args=$4
  shift 4
  rm -rf "$dir"
  launch/braid-local --model "$model" --instances 1 --port "$port" "$@" > "$log.serve.log" 2>&1 &
  local launcher=$!
  for _ in $(seq 1 240); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 0.5; done
  # shellcheck disable=SC2086 # the driver's arguments are a word list on purpose
  "${BENCH_BIN:-build/braid-bench}" run --workload "$workload" --url "http://127.0.0.1:$port" --model "$model" --out "$dir" $driver_args \
    > "$log.run.log" 2>&1 || echo "live_run: braid-bench run failed, see $log.run.log" >&2
  curl -s "http://127.0.0.1:$port/metrics" > "$dir/metrics.txt"
  kill -TERM "$launcher"
  wait "$launcher" || true
}
