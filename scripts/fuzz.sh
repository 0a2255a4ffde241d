#!/usr/bin/env bash
# Coverage-guided fuzzing of every parser target (tests/fuzz) for a bounded time, with clang's
# libFuzzer: builds build-fuzz (ASan + UBSan, no CUDA) and runs each target for SECONDS (default
# 30) over a scratch copy of its seed corpus, so new inputs never land in the repository.
#   scripts/fuzz.sh [SECONDS]
# Exits 0 when no target crashed; 77 (skipped) when clang cannot link -fsanitize=fuzzer.
# A crash leaves its input as build-fuzz/crash-* (libFuzzer's -artifact_prefix).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf '#include <stdint.h>\n#include <stddef.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$probe/p.c"
if ! command -v clang > /dev/null || ! clang -fsanitize=fuzzer "$probe/p.c" -o "$probe/p" 2> /dev/null; then
  echo "[fuzz] skipped: clang with libFuzzer is not installed"
  exit 77
fi
CC=clang cmake -S . -B build-fuzz -DBRAID_FUZZ=ON -DBRAID_TESTS=OFF -DBRAID_SANITIZE=ON -DBRAID_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > build-fuzz.cmake.log 2>&1 || { cat build-fuzz.cmake.log; exit 1; }
# target:corpus directory (tests/fuzz/corpus_*)
targets="fuzz_gguf:gguf fuzz_api_request:api_request fuzz_auth_keys:auth_keys fuzz_trace:trace fuzz_predictor:predictor fuzz_manifest:manifest fuzz_lora_adapter:lora fuzz_chat_template:chat_template fuzz_grammar_spec:grammar_spec fuzz_anthropic_request:anthropic_request"
cmake --build build-fuzz -j2 --target $(for t in $targets; do printf '%s ' "${t%%:*}"; done)
for t in $targets; do
  name=${t%%:*}
  corpus="$probe/${t#*:}"
  cp -r "tests/fuzz/corpus_${t#*:}" "$corpus"
  echo "[fuzz] $name for ${seconds} s"
  binary=$(find build-fuzz -type f -name "$name" -perm -u+x | head -1)
  "$binary" -max_total_time="$seconds" -max_len=65536 -timeout=10 -artifact_prefix=build-fuzz/ -print_final_stats=1 "$corpus" \
    2> "build-fuzz/$name.log" || { tail -40 "build-fuzz/$name.log"; echo "[fuzz] $name crashed"; exit 1; }
  grep -E "stat::number_of_executed_units|stat::new_units_added" "build-fuzz/$name.log" | tr '\n' ' '; echo
done
