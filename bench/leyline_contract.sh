#!/usr/bin/env bash
# Leyline's positional contract live (issue 36: the paper's §4.1 microbenchmark and App. E's
# randomized signed-Δ edit suite; bench/leyline_contract.py says what is compared).
# Usage: bench/leyline_contract.sh [OUT_DIR]   (env: TRIALS=10 CONSTRUCTED=12 TOKENS=4 SEED=7)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
braid=${BRAID_BIN:-$root/build/braid}
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
out=${1:-$root/bench/out/leyline_contract}
mkdir -p "$out"
# shellcheck source=serve_lib.sh
source "$root/bench/serve_lib.sh"
serve contract --kv-blocks 2048 --host-kv-blocks 0
{
  echo "# $(date -u +%FT%TZ) $(uname -n), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); model $(basename "$model")"
  python3 "$root/bench/leyline_contract.py" "$url" --trials "${TRIALS:-10}" --constructed "${CONSTRUCTED:-12}" \
    --tokens "${TOKENS:-4}" --seed "${SEED:-7}" --json "$out/cells.json" --verbose 2> "$out/trials.log"
} | tee "$out/contract.md"
stop
