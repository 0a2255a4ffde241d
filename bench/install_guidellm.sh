#!/usr/bin/env bash
# Installs guidellm (a standard PyPI benchmark client for any OpenAI-compatible server) into its own
# virtual environment, for tests/integration/test_bench_standard_tool.sh:
#   bench/install_guidellm.sh [VENV_DIR]      (default: .venv-guidellm in the repository root)
# then: BRAID_GUIDELLM=VENV_DIR/bin/guidellm ctest -R bench_standard_tool
# Needs PyPI once (guidellm 0.4+ pulls in torch and transformers, ~6 GB); the test itself runs offline.
# Without it the test runs guidellm 0.3.1 (no torch), which scripts/test.sh installs into .venv-test.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$root/.venv-guidellm}
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "guidellm==0.8.1"
"$venv/bin/guidellm" --version
echo "BRAID_GUIDELLM=$venv/bin/guidellm"
