#!/usr/bin/env bash
# How long a dead instance takes to come back under --restart-instances (issue 22, point 1): a
# 2-instance launch/braid-local cluster; instance 1's leader is killed (kill -9) KILLS times (the
# first time the original rank, then each spawned replacement), and each time the seconds from the
# kill to /health "ready" with both instances up are printed. Includes the backoff (1, 2, 4 ... s),
# the spawn and the new leader's model load.
#   bench/restart_time.sh [KILLS]      (default 3; BRAID_MODEL picks the model)
set -uo pipefail
cd "$(dirname "$0")/.."
kills=${1:-3}
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
braid=$(realpath build/braid)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url=http://127.0.0.1:$port
log=$(mktemp)
BRAID_BIN=$braid setsid launch/braid-local --model "$model" --port "$port" --instances 2 --restart-instances "$kills" \
  --kv-blocks 256 --host-kv-blocks 0 > /dev/null 2> "$log" &
launcher=$!
trap 'kill -TERM $launcher 2> /dev/null; wait $launcher 2> /dev/null; rm -f "$log"' EXIT
state() { curl -s "$url/health" | python3 -c 'import json, sys; h = json.load(sys.stdin); print(h["status"], h["instances_alive"])' 2> /dev/null; }
until [ "$(state)" = "ready 2" ]; do kill -0 $launcher 2> /dev/null || { cat "$log"; exit 1; }; sleep 0.2; done
leader() {  # instance 1's leader: world rank 2 at first, then the spawned replacement
  local p
  p=$(pgrep -f "$braid serve .*--port $port( .*)? --respawned-instance 1") && { echo "$p"; return; }
  for p in $(pgrep -f "$braid serve .*--port $port( |\$)"); do
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=2" && { echo "$p"; return; }
  done
}
echo "# bench/restart_time.sh $kills — $(date -u +%F), $(nproc) cores, model $(basename "$model")"
for k in $(seq 1 "$kills"); do
  victim=$(leader)
  t0=$(date +%s.%N)
  kill -KILL "$victim"
  until [ "$(state)" = "degraded 1" ]; do sleep 0.05; done
  until [ "$(state)" = "ready 2" ]; do sleep 0.05; done
  echo "kill $k: back in $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s (backoff $((1 << (k - 1))) s)"
done
