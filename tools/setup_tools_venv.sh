#!/usr/bin/env bash
# Builds .venv-tools/ (git-ignored) with torch (CPU use), transformers, peft and gguf from PyPI for
# tools/train_lora.py and its golden references. CI never runs this: the outputs are committed.
#   tools/setup_tools_venv.sh
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-tools
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check -r tools/lora/requirements.txt
echo "ready: $venv/bin/python"
