# cluster_lib.sh — helpers the cluster integration tests share; sourced, not run.
# The sourcing script sets braid (the binary), model, root (the repository) and work (a scratch
# directory) first. Provides: ok / fail / check (counting $failures), free_port, start_cluster,
# stop_cluster, cluster_gone, wait_ready, metric, wait_for and cleanup (installed as the EXIT trap: kills what a failed
# test left and removes $work). start_cluster sets port, url and launcher_pid; a test that launches
# its own cluster sets them itself and waits with wait_ready.
failures=0
launcher_pid=""
port=0
trap 'cleanup' EXIT

cleanup() {
  [ -n "$launcher_pid" ] && kill -KILL "$launcher_pid" 2> /dev/null
  pkill -KILL -f "$braid serve .*--port $port( |\$)" 2> /dev/null
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$work"
}
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }

# a port below the ephemeral range, so no MPI rank of the job takes it first (free_port.py says why)
free_port() { python3 "$root/tests/integration/free_port.py"; }

# start_cluster NAME ARGS...: launches braid-local in its own session, waits (up to
# $BRAID_TEST_READY_S seconds, default 180) for /health to answer 200.
start_cluster() {
  local name=$1; shift
  port=$(free_port)
  url=http://127.0.0.1:$port
  BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" "$@" > "$work/$name.out" 2> "$work/$name.err" &
  launcher_pid=$!
  for _ in $(seq 1 $((2 * ${BRAID_TEST_READY_S:-180}))); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && { ok "$name: ready"; return 0; }
    kill -0 "$launcher_pid" 2> /dev/null || break
    sleep 0.5
  done
  fail "$name: never became ready"; cat "$work/$name.err"; return 1
}

# wait_ready [CURL ARGS...]: 0 once $url/health answers 200, 1 when the launcher exits or 120 s pass.
wait_ready() {
  for _ in $(seq 1 240); do
    [ "$(curl -s "$@" -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && return 0
    kill -0 "$launcher_pid" 2> /dev/null || return 1
    sleep 0.5
  done
  return 1
}

metric() {  # metric NAME_WITH_LABELS -> the value of that exact series in /metrics
  curl -s "$url/metrics" | awk -v n="$1" '$1 == n {print $2}'
}
wait_for() {  # wait_for SECONDS COMMAND...: polls every 0.2 s until COMMAND succeeds
  local limit=$1; shift
  for _ in $(seq 1 $((limit * 5))); do "$@" && return 0; sleep 0.2; done
  return 1
}

# cluster_gone: no process of this cluster (mpirun or a rank) is left.
cluster_gone() { ! pgrep -f "$braid serve .*--port $port( |\$)" > /dev/null; }

# stop_cluster NAME: SIGTERM to the launcher; it must exit 0 and leave no process behind.
stop_cluster() {
  local name=$1 status
  kill -TERM "$launcher_pid"
  wait "$launcher_pid"; status=$?
  launcher_pid=""
  check "$name: SIGTERM drains and exits 0 (got $status)" [ "$status" = 0 ]
  sleep 0.5
  check "$name: no ranks left" cluster_gone
}
