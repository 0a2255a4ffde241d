#!/usr/bin/env bash
# What a restarted instance's re-warm buys (issue 22, point 1): a 1-instance launch/braid-local
# cluster with --restart-instances 1 gets HEADS distinct prompts of WORDS random words, each twice
# (so the coordinator's recorder counts them hot); its leader is killed (kill -9); once the new
# leader is ready, each prompt is sent again (max_tokens 1, one at a time) and its latency and
# cached_tokens are taken. Run twice: --rewarm-heads 0 (comes back cold) and the default (re-warmed).
# Prints, per run: kill -> ready, ready -> re-warm finished (/metrics braid_instance_rewarms_total),
# the mean latency of the HEADS requests after the restart and their cached tokens.
#   bench/rewarm_time.sh [HEADS] [WORDS]      (default 8 200; BRAID_MODEL picks the model)
set -uo pipefail
cd "$(dirname "$0")/.."
heads=${1:-8}
words=${2:-200}
model=${BRAID_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
braid=$(realpath build/braid)
bodies=$(mktemp -d)
launcher=""
trap '[ -n "$launcher" ] && kill -TERM $launcher 2> /dev/null; wait 2> /dev/null; rm -rf "$bodies"' EXIT
python3 - "$bodies" "$heads" "$words" << 'PY'
import json, random, sys
out, heads, words = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
vocab = ("river stone lantern orchard copper meadow violin harbor pepper glacier thunder willow saddle marble falcon "
         "quartz ember tulip canyon velvet compass juniper anchor bramble cobalt dune fjord garnet hazel ivory jasmine "
         "kettle lilac mosaic nectar onyx pebble quill rustle sparrow timber umber vessel wren yarrow zephyr").split()
for k in range(heads):
    r = random.Random(k)
    text = " ".join(r.choice(vocab) for _ in range(words))
    json.dump({"prompt": text, "max_tokens": 1, "temperature": 0}, open(f"{out}/{k}.json", "w"))
PY
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$1" "$2"; }
send() { curl -s -w ' %{time_total}' "$url/v1/completions" -H 'Content-Type: application/json' -d @"$bodies/$1.json"; }
metric() { curl -s "$url/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
echo "# bench/rewarm_time.sh $heads $words — $(date -u +%F), $(nproc) cores, model $(basename "$model")"
echo "| run | kill → ready (s) | ready → re-warmed (s) | mean latency after restart (s) | cached tokens after restart |"
echo "| --- | ---: | ---: | ---: | ---: |"
for rewarm in 0 64; do
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  url=http://127.0.0.1:$port
  BRAID_BIN=$braid setsid launch/braid-local --model "$model" --port "$port" --instances 1 --restart-instances 1 \
    --rewarm-heads "$rewarm" > /dev/null 2> "$bodies/log.$rewarm" &
  launcher=$!
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ]; do kill -0 $launcher || { cat "$bodies/log.$rewarm"; exit 1; }; sleep 0.2; done
  for pass in 1 2; do for k in $(seq 0 $((heads - 1))); do send "$k" > /dev/null; done; done
  leader=$(for p in $(pgrep -f "$braid serve .*--port $port( |\$)"); do
    tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && echo "$p"; done)
  t0=$(now)
  kill -KILL "$leader"
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 503 ]; do sleep 0.05; done
  until [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ]; do sleep 0.05; done
  t_ready=$(now)
  rewarmed="–"
  if [ "$rewarm" -gt 0 ]; then
    until [ "$(metric braid_instance_rewarms_total)" = 1 ]; do sleep 0.05; done
    rewarmed=$(since "$t_ready" "$(now)")
  fi
  for k in $(seq 0 $((heads - 1))); do send "$k"; echo; done | python3 -c '
import json, sys
rows = [l.rsplit(" ", 1) for l in sys.stdin if l.strip()]
lat = [float(t) for _, t in rows]
cached = sum(json.loads(b)["usage"]["prompt_tokens_details"]["cached_tokens"] for b, _ in rows)
print(f"{sum(lat) / len(lat):.3f} {cached}")' > "$bodies/after"
  read -r latency cached < "$bodies/after"
  echo "| --rewarm-heads $rewarm | $(since "$t0" "$t_ready") | $rewarmed | $latency | $cached |"
  kill -TERM $launcher; wait $launcher 2> /dev/null; launcher=""
done
