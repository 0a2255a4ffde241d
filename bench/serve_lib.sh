# serve_lib.sh — a 1-instance `launch/braid-local` server for the live benchmarks; sourced, not run.
# The sourcing script sets root, braid, model and out first. Provides port, url, pid and:
#   serve NAME ARGS...  starts it in its own session (logs in $out/NAME.out / .err) and waits (up to
#                       10 min, a warm start included) until /health answers 200; exits 1 if it never does;
#   stop                SIGTERM, waits for the launcher;
#   metric NAME         the value of one /metrics sample.
# On any exit the server's whole session is killed.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
pid=""
trap '[ -n "$pid" ] && kill -KILL -- -"$pid" 2> /dev/null || true' EXIT

serve() {
  local name=$1; shift
  BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --instances 1 "$@" > "$out/$name.out" 2> "$out/$name.err" &
  pid=$!
  for _ in $(seq 1 1200); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && return 0
    sleep 0.5
  done
  echo "server $name did not get ready (see $out/$name.err)" >&2
  exit 1
}
stop() { kill -TERM "$pid"; wait "$pid" || true; pid=""; }
metric() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
