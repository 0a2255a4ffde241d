#!/usr/bin/env bash
# Regenerates tests/golden/ from HF transformers running the same GGUF on the CPU in fp32.
#   tools/golden/make_golden.sh [MODEL.gguf]
set -euo pipefail
cd "$(dirname "$0")/../.."
model=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
venv=.venv-golden
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r tools/golden/requirements.txt
HF_HUB_OFFLINE=1 "$venv/bin/python" tools/golden/make_golden.py --model "$model" --out tests/golden
