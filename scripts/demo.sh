#!/usr/bin/env bash
# The main job: set everything up on a fresh machine, start a local Braid cluster on the default
# model, answer a chat request through the OpenAI-compatible API, run a short agentic workload
# (codegen: planner → coder → tester loops) through it with a progress bar, print the summary, and
# stop the cluster cleanly.
#   scripts/demo.sh [--instances I] [--workflows N] [--port P]
set -euo pipefail
cd "$(dirname "$0")/.."
instances=1 workflows=4 port=8000
while [ $# -gt 0 ]; do
  case "$1" in
    --instances) instances=$2; shift 2 ;;
    --workflows) workflows=$2; shift 2 ;;
    --port) port=$2; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
scripts/setup.sh build
url=http://127.0.0.1:$port
if curl -s -o /dev/null "$url/health"; then
  echo "demo.sh: something already listens on port $port; pass --port" >&2
  exit 1
fi

log=$(mktemp -d)
echo
echo "== launch/braid-local --instances $instances --port $port   (logs in $log)"
launch/braid-local --instances "$instances" --port "$port" > "$log/serve.out" 2> "$log/serve.err" &
launcher=$!
stop() {
  [ -n "${launcher:-}" ] || return 0
  kill -TERM "$launcher" 2> /dev/null && wait "$launcher" 2> /dev/null
  launcher=""
}
trap stop EXIT
for _ in $(seq 1 240); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/health")" = 200 ] && break
  kill -0 "$launcher" 2> /dev/null || { echo "demo.sh: the cluster exited:" >&2; cat "$log/serve.err" >&2; exit 1; }
  sleep 0.5
done
cat "$log/serve.out"

echo
echo "== POST /v1/chat/completions: \"What is the capital of France?\""
curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 48, "temperature": 0}' |
  python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["choices"][0]["message"]["content"].strip()); print("usage:", json.dumps(r["usage"]))'
# The first token of this answer is a near-tie for the 135M model (transformers: "The" 0.08 above
# "L"), and the default int8 arithmetic tips it, as llama.cpp's does; show the fp32 one beside it.
echo "== the same question in the fp32 arithmetic (braid generate --cpu-matmul fp32; the cluster runs int8)"
build/braid generate --chat --prompt "What is the capital of France?" --max-tokens 48 --cpu-matmul fp32 2> /dev/null
echo
qwen=models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
if [ -f "$qwen" ]; then
  echo "== the same question to Qwen2.5-Coder-0.5B ($qwen, from scripts/fetch-model.sh qwen)"
  build/braid generate --model "$qwen" --chat --prompt "What is the capital of France?" --max-tokens 48 2> /dev/null
  echo
fi

echo
echo "== a tool call, as an agent framework asks for one (tools, tool_choice \"required\")"
curl -s "$url/v1/chat/completions" -H 'Content-Type: application/json' -d '{"messages": [{"role": "user",
  "content": "What is the weather in Paris?"}], "max_tokens": 64, "temperature": 0, "tool_choice": "required", "tools": [{"type":
  "function", "function": {"name": "get_weather", "description": "Current weather of a city", "parameters": {"type": "object",
  "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}' |
  python3 -c 'import json, sys; r = json.load(sys.stdin)["choices"][0]; print("finish_reason:", r["finish_reason"]); print("tool_calls:", json.dumps(r["message"].get("tool_calls")))'

echo
echo "== braid-bench run --workload codegen --workflows $workflows --concurrency 2 (short prompts: --scale 0.3)"
build/braid-bench run --workload codegen --url "$url" --workflows "$workflows" --concurrency 2 --scale 0.3 \
  --max-tokens-cap 32 --out "$log/codegen"
echo
echo "Per-request log, summary.json and a trace for 'build/braid sim' are in $log/codegen."
stop
echo "== cluster stopped"
