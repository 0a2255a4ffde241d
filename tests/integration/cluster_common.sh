# cluster_common.sh — helpers the cluster integration tests source (bash): check bookkeeping, a free
# port, and a braid-local cluster's start-up wait and clean-up.
# The sourcing script sets $work (a temporary folder) and uses $launcher_pid / $port / $url; its
# EXIT trap runs cleanup, which kills what it started and removes $work.
failures=0
launcher_pid=""
port=""

cleanup() {
  [ -n "$launcher_pid" ] && kill -KILL "$launcher_pid" 2> /dev/null
  [ -n "$port" ] && pkill -KILL -f "braid serve .*--port $port" 2> /dev/null
  rm -rf "$work"
}
ok() { echo "ok   $*"; }
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
check() { local what=$1; shift; if "$@"; then ok "$what"; else fail "$what"; fi; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# wait_ready [CURL ARGS...]: 0 once $url/health answers 200, 1 when the launcher exits or 120 s pass.
wait_ready() {
  for _ in $(seq 1 240); do
    [ "$(curl -s "$@" -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && return 0
    kill -0 "$launcher_pid" 2> /dev/null || return 1
    sleep 0.5
  done
  return 1
}
