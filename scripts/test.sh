#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the whole test suite:
#   1. release build: every test (unit, golden against HF transformers, fuzz replay, CLI integration)
#   2. ASan + UBSan build (also checks the pool invariant every engine step): everything but the
#      slow model-heavy tests (logits golden, engine, int8 vs fp32 engine) and the two mpirun tests (Open MPI's own
#      allocations would drown LeakSanitizer), which run in the release build
#   3. libFuzzer (scripts/fuzz.sh): every parser target, coverage-guided, $BRAID_FUZZ_SECONDS (default
#      30) each; skipped when clang has no libFuzzer
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
# The cluster test drives the server with the official openai client, from a venv of its own; the
# KV events test subscribes with pyzmq and msgpack from the same venv; the agent-clients test runs
# LangGraph's ReAct agent through langchain-openai; the prompt-cache dialects test parses /metrics
# with prometheus_client's text parser; the Anthropic Messages test uses the official anthropic SDK.
if ! .venv-test/bin/python -c 'import openai, zmq, msgpack, langgraph, langchain_openai, prometheus_client, anthropic' 2> /dev/null; then
  echo "[test] installing the openai client, pyzmq, msgpack, langgraph and langchain-openai into .venv-test"
  [ -x .venv-test/bin/python ] || python3 -m venv .venv-test
  .venv-test/bin/pip install -q "openai==3.54.0" "pyzmq==26.2.0" "msgpack==1.1.0" "langgraph==1.2.24" "langchain-openai==1.7.4" "prometheus-client==0.21.1" "anthropic==2.14.0"
fi
# The standard-tool test runs guidellm against a live cluster: 0.3.1 is its last release without
# torch (~0.55 GB with datasets and transformers, against ~6 GB for later ones); gguf and tokenizers
# turn the GGUF's tokenizer into a local tokenizer.json for it (bench/gguf_tokenizer_json.py).
if ! .venv-test/bin/python -c 'import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in ("guidellm", "gguf")))' 2> /dev/null; then
  echo "[test] installing guidellm 0.3.1 and gguf into .venv-test"
  .venv-test/bin/pip install -q "guidellm==0.3.1" "transformers==4.57.1" "gguf==0.19.0"
fi
echo "[test] release build"
ctest --test-dir build --output-on-failure -j2

echo "[test] sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -DBRAID_SANITIZE=ON -DBRAID_CUDA=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo > build-asan.cmake.log 2>&1 \
  || { cat build-asan.cmake.log; exit 1; }
cmake --build build-asan -j"$(nproc)"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j2 -E 'test_golden_logits|test_golden_lora|test_engine|test_int8_engine|cluster_integration|agent_clients_integration|kv_events_integration|segment_reuse_integration|directives_integration|bench_driver_integration|bench_standard_tool_integration|rank_binding_integration|slurm_integration'

echo "[test] libFuzzer, ${BRAID_FUZZ_SECONDS:-30} s per target"
status=0
scripts/fuzz.sh "${BRAID_FUZZ_SECONDS:-30}" || status=$?
[ "$status" = 0 ] || [ "$status" = 77 ] || exit "$status"
