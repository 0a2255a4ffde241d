#!/usr/bin/env bash
# The main job: set everything up on a fresh machine, then show the model answering on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
echo
echo "== braid info"
build/braid info
echo
echo '== braid generate --chat --prompt "What is the capital of France?"'
build/braid generate --chat --prompt "What is the capital of France?" --max-tokens 64
echo
echo '== braid generate --chat (sampled: temperature 0.7, top-p 0.9, seed 7)'
build/braid generate --chat --prompt "Write a haiku about caches." --max-tokens 64 --temperature 0.7 --top-p 0.9 --seed 7
