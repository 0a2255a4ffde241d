#!/usr/bin/env bash
# Agent clients against a real cluster (1 + 1x1 ranks, the default model): the official openai
# client's tool calls (required, named, auto, none; whole and streamed; a second turn with the
# tool's result), structured outputs (json_schema, json_object, beta.chat.completions.parse with a
# Pydantic model), the 400s of malformed tool requests, and LangGraph's prebuilt ReAct agent with
# two tools through langchain-openai (tests/integration/agent_clients_test.py).
#   tests/integration/test_agent_clients.sh BRAID_BINARY MODEL
# The python with openai, langgraph and langchain-openai: $BRAID_TEST_PYTHON, else .venv-test/bin/python.
set -uo pipefail
braid=$(realpath "$1")
model=$(realpath "$2")
root=$(cd "$(dirname "$0")/../.." && pwd)
python=${BRAID_TEST_PYTHON:-$root/.venv-test/bin/python}
work=$(mktemp -d)
# shellcheck source=cluster_lib.sh
source "$root/tests/integration/cluster_lib.sh"

if ! [ -x "$python" ] || ! "$python" -c 'import openai, langgraph, langchain_openai' 2> /dev/null; then
  fail "openai, langgraph and langchain-openai are not installed for $python (scripts/test.sh sets them up)"
  exit 1
fi
start_cluster agents --instances 1 --kv-blocks 512 || exit 1
served=$(curl -s "$url/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')
check "agent clients suite" "$python" "$root/tests/integration/agent_clients_test.py" "$url/v1" "$served"
stop_cluster agents
echo "$failures failed"
[ "$failures" = 0 ]
