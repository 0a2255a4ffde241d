#!/usr/bin/env bash
# Live cache-directive benchmarks (issue 18): splice latency in an 8K context vs re-prefill, and
# pins under pool pressure (bench/directives_live.py says what each measures).
# Usage: bench/directives_live.sh [OUT_DIR]   (env: REPS=3 PRESSURE_N=64 PHASES="latency pressure")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/directives_live}
reps=${REPS:-3}
pressure_n=${PRESSURE_N:-64}
phases=${PHASES:-latency pressure}
mkdir -p "$out"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port

serve() {  # serve NAME ARGS...: a 1-instance cluster on $port, waited for
  local name=$1; shift
  BRAID_BIN=$braid setsid "$root/launch/braid-local" --model "$model" --port "$port" --instances 1 "$@" > "$out/$name.out" 2> "$out/$name.err" &
  pid=$!
  for _ in $(seq 1 360); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && return 0
    sleep 0.5
  done
  echo "server $name did not start" >&2; exit 1
}
stop() { kill -TERM "$pid"; wait "$pid" || true; pid=""; }
# The launcher runs in its own session (setsid): on any exit, everything in it goes.
trap '[ -n "$pid" ] && kill -KILL -- -"$pid" 2> /dev/null || true' EXIT

if [[ " $phases " == *" latency "* ]]; then
  echo "== latency: 1K-token splice in an 8K context ($reps repetitions) ==" | tee "$out/latency.md"
  serve latency --kv-blocks 2048 --max-batch-tokens 512
  python3 "$root/bench/directives_live.py" latency "$url" "$reps" | tee -a "$out/latency.md"
  stop
fi
if [[ " $phases " == *" pressure "* ]]; then
  echo "== pins under pressure: $pressure_n requests, 8 tenants, a 256-block pool ==" | tee "$out/pressure.md"
  serve pressure --kv-blocks 256 --host-kv-blocks 0 --pin-budget 1024
  python3 "$root/bench/directives_live.py" pressure "$url" "$pressure_n" | tee -a "$out/pressure.md"
  stop
fi
