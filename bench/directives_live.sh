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
# shellcheck source=serve_lib.sh
source "$root/bench/serve_lib.sh"

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
