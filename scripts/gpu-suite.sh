#!/usr/bin/env bash
# gpu-suite.sh — issue 34's one prepared GPU visit: every GPU figure in one run of at most
# --budget seconds (default 540 = 9 min), stages in priority order, each under its own timeout
# (and never past the budget), so one hang costs only its stage.
#   (a) GPU tests (label gpu) + compute-sanitizer memcheck on the newest kernels
#   (b) tensor parallelism: TP = 2 equal to TP = 1 (greedy outputs through the HTTP API)
#   (c) KV moves between two instances on one GPU (CUDA IPC) vs cudaMemcpy device-to-device
#   (d) host KV tier STORE/LOAD GB/s vs pinned cudaMemcpy
#   (e) prefill / decode vs the ceilings (default GGUF; synthetic Llama-3-8B shape)
#   (f) llama.cpp's CUDA build beside Braid (staged by scripts/stage-llamacpp.sh pack): single stream,
#       16 and 64 parallel sequences (llama-batched-bench -fa), llama-bench pp512 / tg128
#   (g) mission arms on the synthetic 8B: PBKV vs LRU workflow latency, ForkKV, segment reuse, splice
# A stage whose code or binaries are not there records "skipped: <why>" instead of failing.
#
# Usage (from the repository root):
#   scripts/gpu-suite.sh [--rehearse] [--stage DIR] [--budget SECONDS] [--only "a b ..."]
#   --stage DIR   a payload unpacked by scripts/gpu-stage.sh (DIR/bin, DIR/lib, DIR/model.gguf,
#                 optional DIR/llama.cpp/); default: the build dirs here (build-gpu-cuda, else build-gpu)
#   --rehearse    CPU stand-ins for every stage (automatic when no GPU is visible): --device cpu,
#                 synthetic:smollm2-135m instead of synthetic:llama3-8b, small sizes; checks the
#                 script end to end so the first GPU call is the real one
#   env G_ARMS    stage g's arms (default "pbkv forkkv segment_reuse splice"); BRAID_CUDA_PREFILL=wmma|flash
#                 picks the prefill kernel (default wmma; stage a sets flash once its test passes)
# Writes $OUT (default /tmp/gpu-suite-out): gpu-suite.json (every stage: status, seconds, metrics),
# gpu-suite.md (the short table, also printed last) and gpu-suite-logs.tar.gz (every stage's log).
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
mode=auto stage_dir="" budget=540 only="a b c d e f g"
while [ $# -gt 0 ]; do
  case "$1" in
    --rehearse) mode=rehearse ;;
    --gpu) mode=gpu ;;
    --stage) stage_dir=$(cd "$2" && pwd); shift ;;
    --budget) budget=$2; shift ;;
    --only) only=$2; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu-suite: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
if [ "$mode" = auto ]; then
  if command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q GPU; then mode=gpu; else mode=rehearse; fi
fi

OUT=${OUT:-/tmp/gpu-suite-out}
mkdir -p "$OUT"
work=$(mktemp -d /tmp/gpu-suite.XXXXXX)
mkdir -p "$work/logs" "$work/metrics"
t_start=$SECONDS
deadline=$((SECONDS + budget))

# ---- where the binaries and the model are ----
if [ -n "$stage_dir" ]; then
  bin=$stage_dir/bin tests=$stage_dir/bin model=$stage_dir/model.gguf
  export LD_LIBRARY_PATH=$stage_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  build=${BUILD_DIR:-}
  if [ -z "$build" ]; then
    if [ "$mode" = gpu ] && [ -x build-gpu-cuda/braid ]; then build=build-gpu-cuda; else build=build-gpu; fi
  fi
  bin=$root/$build tests=$root/$build/tests model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}
fi
# sizes: the GPU's, or the CPU stand-ins' (a loaded 2-core VM must get through every stage in the budget)
if [ "$mode" = gpu ]; then device=cuda big=synthetic:llama3-8b greedy_tokens=16 small_tokens=128
else device=cpu big=synthetic:smollm2-135m greedy_tokens=4 small_tokens=4; fi
# each stage's own cap (s), on top of the whole budget: priority order decides what a slow stage squeezes
# (sum 1230 s > the 540 s budget on purpose: a stage that finishes early leaves its time to the next)
declare -A stage_cap=([a]=200 [b]=150 [c]=260 [d]=90 [e]=150 [f]=120 [g]=260)
# the CPU stand-in of (f) runs llama.cpp on this VM's CPU as well: more time, fewer sequences
[ "$mode" = rehearse ] && stage_cap[f]=240
stage_end=0
big_spec=$big:$model # the synthetic model takes the default GGUF's tokenizer
export BRAID_TEST_MODEL=$model BRAID_TEST_GOLDEN_DIR=$root/tests/golden BRAID_TEST_ADAPTER_DIR=$root/adapters
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export bin model work greedy_tokens # for the functions steps run in a child bash
echo "gpu-suite: mode $mode, device $device, binaries $bin, model $model, budget ${budget}s" >&2

# ---- helpers ----
remaining() { echo $((deadline - SECONDS)); }
# metric STAGE KEY VALUE: one figure of a stage (numbers stay numbers in the JSON)
metric() { printf '%s\t%s\n' "$2" "$3" >> "$work/metrics/$1.tsv"; }
# step NAME LIMIT CMD...: runs CMD (log in logs/NAME.log) under min(LIMIT, what the budget leaves
# minus 20 s for the summary); returns its status, 124 on a timeout, 125 when no time was left.
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( $(remaining) - 20 )) stage_left=$((stage_end - SECONDS))
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$stage_left" -lt "$limit" ] && limit=$stage_left
  if [ "$limit" -lt 5 ]; then echo "out of time" > "$work/logs/$name.log"; return 125; fi
  local t0=$SECONDS
  if declare -F "$1" > /dev/null; then # a function of this script: timeout runs it in a child bash
    export -f "$1"
    timeout -k 5 "$limit" bash -c '"$@"' _ "$@" > "$work/logs/$name.log" 2>&1
  else
    timeout -k 5 "$limit" "$@" > "$work/logs/$name.log" 2>&1
  fi
  local rc=$?
  printf '  %-34s rc=%-3d %4ds\n' "$name" "$rc" $((SECONDS - t0)) >&2
  return $rc
}
# finish STAGE STATUS DETAIL SECONDS: the stage's line in results.jsonl
finish() {
  python3 - "$work" "$1" "$2" "$3" "$4" >> "$work/results.jsonl" << 'EOF'
import json, os, sys
work, stage, status, detail, secs = sys.argv[1:6]
metrics = {}
path = os.path.join(work, "metrics", stage + ".tsv")
if os.path.exists(path):
    for line in open(path):
        k, _, v = line.rstrip("\n").partition("\t")
        try:
            metrics[k] = float(v) if any(c in v for c in ".eE") else int(v)
        except ValueError:
            metrics[k] = v
print(json.dumps({"stage": stage, "status": status, "detail": detail, "seconds": int(secs), "metrics": metrics}))
EOF
}
have() { [ -x "$1" ]; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# A braid-local server in its own session: serve_start NAME ARGS... (waits for /health, up to 150 s)
srv_pid="" srv_url=""
serve_start() {
  local name=$1; shift
  local port; port=$(free_port)
  srv_url=http://127.0.0.1:$port
  BRAID_BIN=$bin/braid setsid "$root/launch/braid-local" --port "$port" "$@" > "$work/logs/$name.server.log" 2>&1 &
  srv_pid=$!
  # polls until a clock bound, never past the budget (less 30 s) or the stage's cap (less 10 s), 150 s at most;
  # curl -m 2: a server that accepts but never answers cannot stretch a poll
  local until=$((deadline - 30))
  [ $((stage_end - 10)) -lt "$until" ] && until=$((stage_end - 10))
  [ $((SECONDS + 150)) -lt "$until" ] && until=$((SECONDS + 150))
  while [ "$SECONDS" -lt "$until" ]; do
    [ "$(curl -s -m 2 -o /dev/null -w '%{http_code}' "$srv_url/health")" = 200 ] && return 0
    kill -0 "$srv_pid" 2> /dev/null || break
    sleep 0.5
  done
  echo "server $name did not get ready" >> "$work/logs/$name.server.log"
  serve_stop
  return 1
}
serve_stop() {
  [ -n "$srv_pid" ] || return 0
  kill -TERM "$srv_pid" 2> /dev/null
  for _ in $(seq 1 40); do kill -0 "$srv_pid" 2> /dev/null || break; sleep 0.25; done
  kill -KILL -- -"$srv_pid" 2> /dev/null
  wait "$srv_pid" 2> /dev/null
  srv_pid=""
}
trap 'serve_stop; rm -rf "$work"' EXIT

# greedy_texts URL FILE: three fixed prompts at temperature 0, their texts one per line
greedy_texts() {
  local url=$1 file=$2
  : > "$file"
  for p in "The capital of France is" "def fibonacci(n):" "Once upon a time, in a small village,"; do
    curl -s -m 60 "$url/v1/completions" -H 'Content-Type: application/json' \
      -d "{\"prompt\":\"$p\",\"max_tokens\":${greedy_tokens:-16},\"temperature\":0,\"ignore_eos\":true}" |
      python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["choices"][0]["text"]))' >> "$file" || return 1
  done
}

# ---- stages ----

stage_a() { # GPU tests + memcheck
  local t0=$SECONDS pass=0 fail=0 skip=0 missing=0 failed=""
  local list=(test_attention_prefill_cuda test_synthetic_cuda test_cuda_backend test_cache_paths_cuda test_rotate:cuda test_residual_attention_cuda test_grammar_mask_cuda
              test_lora_cuda test_arch_cuda test_engine_grammar:cuda test_engine:cuda)
  for entry in "${list[@]}"; do
    local name=${entry%%:*} env=()
    [ "$entry" != "$name" ] && env=(env BRAID_TEST_DEVICE=cuda)
    if ! have "$tests/$name"; then missing=$((missing + 1)); continue; fi
    step "a_$name" 150 "${env[@]}" "$tests/$name"
    local rc=$?
    case $rc in 0) pass=$((pass + 1)) ;; 77) skip=$((skip + 1)) ;; *) fail=$((fail + 1)); failed="$failed $name" ;; esac
    if [ "$name" = test_attention_prefill_cuda ]; then
      # the flash prefill kernel is opt-in until it has passed here: only then do the later stages use it
      if [ $rc = 0 ]; then export BRAID_CUDA_PREFILL=flash; metric a prefill_kernel "flash (its test passed)"
      else export BRAID_CUDA_PREFILL=wmma; metric a prefill_kernel "wmma (flash failed or skipped its test)"; fi
      grep '^prefill-attention' "$work/logs/a_$name.log" | awk '{split($2,k,"="); split($4,m,"="); split($5,t,"=");
        printf "attn4096_%s_ms\t%s\nattn4096_%s_tflops\t%s\n", k[2], m[2], k[2], t[2]}' >> "$work/metrics/a.tsv"
    fi
  done
  local sanitizer; sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  local memcheck="not run"
  if [ "$mode" = gpu ] && [ -x "$sanitizer" ] && have "$tests/test_synthetic_cuda"; then
    # the newest kernels: synthetic weight generation (memory_ops.cu) over the whole forward
    step a_memcheck_synthetic 120 env BRAID_TEST_QUICK=1 "$sanitizer" --tool memcheck --error-exitcode 9 "$tests/test_synthetic_cuda"
    case $? in
      0) memcheck=clean ;;
      124|125) memcheck="timed out" ;;
      *) memcheck=errors; fail=$((fail + 1)); failed="$failed memcheck" ;;
    esac
    if have "$tests/test_attention_prefill_cuda"; then
      # both prefill attention kernels on the small scenarios (QUICK skips the 4096-token case)
      step a_memcheck_prefill 90 env BRAID_TEST_QUICK=1 "$sanitizer" --tool memcheck --error-exitcode 9 "$tests/test_attention_prefill_cuda"
      case $? in
        0) memcheck="$memcheck, prefill clean" ;;
        124|125) memcheck="$memcheck, prefill timed out" ;;
        *) memcheck="$memcheck, prefill errors"; fail=$((fail + 1)); failed="$failed memcheck_prefill" ;;
      esac
    fi
  elif [ "$mode" = rehearse ] && have "$tests/test_synthetic_model"; then
    # CPU stand-in: the synthetic model's CPU test in place of the sanitizer run
    if step a_standin_test_synthetic_model 120 "$tests/test_synthetic_model"; then pass=$((pass + 1)); else fail=$((fail + 1)); failed="$failed test_synthetic_model"; fi
  fi
  metric a passed $pass; metric a failed $fail; metric a skipped_no_gpu $skip; metric a not_built $missing; metric a memcheck "$memcheck"
  if [ $fail -gt 0 ]; then finish a fail "failed:$failed" $((SECONDS - t0))
  elif [ $pass -eq 0 ]; then finish a "skipped: no GPU (every GPU test exited 77)" "$skip skipped, $missing not built" $((SECONDS - t0))
  else finish a pass "$pass passed, $skip skipped, $missing not built, memcheck $memcheck" $((SECONDS - t0)); fi
}

stage_b() { # TP = 2 equals TP = 1
  local t0=$SECONDS
  have "$bin/braid" || { finish b "skipped: no braid binary" "" 0; return; }
  if [ "$device" = cuda ]; then
    # both ranks on GPU 0: the host-staged all-reduce (NCCL refuses two ranks on one GPU)
    step b_tp_cuda 240 bash "$root/tests/integration/test_tp_cuda.sh" "$bin/braid" "$model"
    local rc=$?
    metric b checks_ok "$(grep -c '^ok' "$work/logs/b_tp_cuda.log")"; metric b checks_failed "$(grep -c '^FAIL' "$work/logs/b_tp_cuda.log")"
    case $rc in
      0) finish b pass "tests/integration/test_tp_cuda.sh: GGUF + synthetic, tp=2 (host-staged) == tp=1" $((SECONDS - t0)) ;;
      77) finish b "skipped: $(tail -1 "$work/logs/b_tp_cuda.log")" "" $((SECONDS - t0)) ;;
      *) finish b fail "test_tp_cuda.sh rc=$rc (logs/b_tp_cuda.log)" $((SECONDS - t0)) ;;
    esac
    return
  fi
  # CPU stand-in: the CPU backend's TP (MPI all-reduce) on the synthetic shape, fp32 arithmetic
  local m=synthetic:smollm2-135m:$model ok=1 # three KV heads: TP = 2 splits them 2 + 1
  for tp in 1 2; do
    if serve_start "b_tp$tp" --model "$m" --instances 1 --tp $tp --device cpu --cpu-matmul fp32 --kv-blocks 256; then
      step "b_tp${tp}_requests" 90 greedy_texts "$srv_url" "$work/b_tp$tp.txt" || ok=0
      serve_stop
    else ok=0; fi
  done
  if [ $ok = 1 ] && cmp -s "$work/b_tp1.txt" "$work/b_tp2.txt"; then
    metric b equal_outputs 3
    finish b "pass (cpu stand-in)" "synthetic:smollm2-135m, 3 greedy completions identical at tp=1 and tp=2" $((SECONDS - t0))
  elif [ $ok = 1 ]; then
    diff "$work/b_tp1.txt" "$work/b_tp2.txt" > "$work/logs/b_diff.log"
    finish b fail "tp=2 outputs differ from tp=1 (logs/b_diff.log)" $((SECONDS - t0))
  else finish b fail "a server or request failed (logs/b_*)" $((SECONDS - t0)); fi
}

stage_c() { # KV moves between two instances on one GPU
  local t0=$SECONDS ipc="" 
  # the IPC data path between two CUDA processes (tests/gpu/test_cuda_kv_ipc.c): exact copies + rate
  if [ "$device" = cuda ] && have "$tests/test_cuda_kv_ipc"; then
    step c_kv_ipc 90 "$tests/test_cuda_kv_ipc"
    case $? in
      0) ipc=pass
         python3 - "$work/logs/c_kv_ipc.log" >> "$work/metrics/c.tsv" << 'EOF2'
import json, sys
for line in open(sys.argv[1]):
    if '"kv_ipc"' in line:
        r = json.loads(line)
        print(f"ipc_run256_gbs\t{r['ipc_gbs']}\nd2d_memcpy_gbs\t{r['d2d_memcpy_gbs']}\nipc_vs_d2d\t{r['ratio']}")
EOF2
         ;;
      77) ipc="skipped" ;;
      *) ipc=fail ;;
    esac
  fi
  # the real move path: two CUDA instances on the GPU, the router's move over IPC (tests/integration/test_kv_moves_cuda.sh)
  local moves="" staged=""
  if [ "$device" = cuda ] && have "$bin/braid"; then
    KV_MOVES_CUDA_ONLY=ipc step c_kv_moves_cuda 120 bash "$root/tests/integration/test_kv_moves_cuda.sh" "$bin/braid" "$model"
    case $? in
      0) moves=pass ;;
      77) moves=skipped ;;
      *) moves=fail ;;
    esac
    metric c moves_checks_ok "$(grep -c '^ok' "$work/logs/c_kv_moves_cuda.log")"
    metric c moves_checks_failed "$(grep -c '^FAIL' "$work/logs/c_kv_moves_cuda.log")"
    # the cross-node path on the one GPU: IPC off for loans (BRAID_KV_MOVE_STAGED=1), pinned host staging over UCX
    KV_MOVES_CUDA_ONLY=staged step c_kv_moves_staged 100 bash "$root/tests/integration/test_kv_moves_cuda.sh" "$bin/braid" "$model"
    case $? in
      0) staged=pass ;;
      77) staged=skipped ;;
      *) staged=fail ;;
    esac
    metric c staged_checks_ok "$(grep -c '^ok' "$work/logs/c_kv_moves_staged.log")"
    metric c staged_checks_failed "$(grep -c '^FAIL' "$work/logs/c_kv_moves_staged.log")"
    python3 - "$work/logs/c_kv_moves_cuda.log" "$work/logs/c_kv_moves_staged.log" >> "$work/metrics/c.tsv" << 'EOF2'
import json, sys
rate = {}
for path in sys.argv[1:]:
    try: lines = open(path).readlines()
    except OSError: continue
    for line in lines:
        if line.startswith('{"bench":"kv_moves_cuda'):
            r = json.loads(line)
            key = "staged" if r["bench"] == "kv_moves_cuda_staged" else "moves"
            rate[key] = float(r["pair_gbps"])
            print(f"{key}_moved_blocks\t{r['moved_blocks']}\n{key}_moved_bytes\t{r['moved_bytes']}\n{key}_pair_gbps\t{r['pair_gbps']}")
if rate.get("moves", 0) > 0 and "staged" in rate: print(f"staged_vs_ipc\t{rate['staged'] / rate['moves']:.3f}")
EOF2
  fi
  # the staged moves' pipeline logic (chunking, order, failure and timeout in mid-move, buffer reuse): CPU, both modes
  local pipe=""
  if have "$tests/test_kv_stage_pipe"; then
    if step c_stage_pipe 30 "$tests/test_kv_stage_pipe"; then pipe=pass; else pipe=fail; fi
  fi
  # ...and its wire half over real UCX between 2 ranks, a CPU rank standing in for the lender's staging
  if have "$tests/test_kv_stage_wire" && command -v mpirun > /dev/null; then
    if step c_stage_wire 60 mpirun --allow-run-as-root --oversubscribe -n 2 -x UCX_TLS=tcp "$tests/test_kv_stage_wire"; then
      [ "$pipe" = fail ] || pipe=pass
      local wire_s; wire_s=$(grep -o '"seconds":[0-9.]*' "$work/logs/c_stage_wire.log" | head -1 | cut -d: -f2)
      [ -n "$wire_s" ] && metric c stage_wire_3mib_s "$wire_s"
    else pipe=fail; fi
  fi
  # the UCX data plane's rate between two ranks (host memory): what CPU instances' moves use
  if have "$bin/bench_kv_move" && command -v mpirun > /dev/null; then
    if step c_bench_kv_move 60 mpirun --oversubscribe -n 2 "$bin/bench_kv_move" --blocks 256 --repeats 2 --large-mib 16; then
      local gbs; gbs=$(grep '"mode":"run"' "$work/logs/c_bench_kv_move.log" | grep -o '"gb_per_s":[0-9.]*' | tail -1 | cut -d: -f2)
      [ -n "$gbs" ] && metric c ucx_host_run256_gbs "$gbs"
    fi
  fi
  local why="the move path (test_kv_moves_cuda.sh) $moves, staged across \"nodes\" $staged, staging pipeline and wire (test_kv_stage_pipe, test_kv_stage_wire) ${pipe:-not built}"
  [ "$moves" = fail ] && ipc="$ipc+moves_fail"
  [ "$staged" = fail ] || [ "$pipe" = fail ] && ipc="$ipc+moves_fail"
  case "$device:$ipc" in
    cuda:pass) finish c pass "CUDA IPC copies exact, rate measured; $why" $((SECONDS - t0)) ;;
    cuda:pass+moves_fail*) finish c fail "$why (logs/c_kv_moves_cuda.log, c_kv_moves_staged.log, c_stage_pipe.log, c_stage_wire.log); IPC copies exact" $((SECONDS - t0)) ;;
    cuda:fail*) finish c fail "test_cuda_kv_ipc failed (logs/c_kv_ipc.log); $why" $((SECONDS - t0)) ;;
    cuda:*) finish c "skipped: test_cuda_kv_ipc not staged or no GPU" "" $((SECONDS - t0)) ;;
    *:*moves_fail*) finish c fail "$why (logs/c_stage_pipe.log, c_stage_wire.log)" $((SECONDS - t0)) ;;
    *) finish c "pass (cpu stand-in)" "UCX host-memory moves between 2 ranks, staging pipeline ${pipe:-not built}; CUDA IPC and staged moves need a GPU" $((SECONDS - t0)) ;;
  esac
}

stage_d() { # host tier copies vs pinned cudaMemcpy
  local t0=$SECONDS
  have "$bin/bench_cache_ops" || { finish d "skipped: bench_cache_ops not built" "" 0; return; }
  step d_cache_ops 60 "$bin/bench_cache_ops" --model "$model" --device $device --blocks 256 --batch 1,16,256 --repeats 3 ||
    { finish d fail "bench_cache_ops failed (logs/d_cache_ops.log)" $((SECONDS - t0)); return; }
  python3 - "$work/logs/d_cache_ops.log" >> "$work/metrics/d.tsv" << 'EOF'
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        print(f"{r['op'].lower()}_b{r['batch']}_gbs\t{r['gb_per_s']}")
EOF
  if [ "$device" = cuda ] && have "$bin/bench_cuda"; then
    step d_ceilings 60 "$bin/bench_cuda" --model "$model" --batches 1 --steps 2 --prefill 0 --no-graphs
    python3 - "$work/logs/d_ceilings.log" "$work/metrics/d.tsv" >> "$work/metrics/d.tsv" << 'EOF'
import json, sys
m = dict(l.rstrip("\n").split("\t", 1) for l in open(sys.argv[2]))
for line in open(sys.argv[1]):
    if '"ceilings"' in line:
        c = json.loads(line)
        print(f"pinned_h2d_gbs\t{c['pinned_h2d_gbs']}\npinned_d2h_gbs\t{c['pinned_d2h_gbs']}")
        if "load_b256_gbs" in m: print(f"load_vs_pinned\t{float(m['load_b256_gbs']) / c['pinned_h2d_gbs']:.3f}")
        if "store_b256_gbs" in m: print(f"store_vs_pinned\t{float(m['store_b256_gbs']) / c['pinned_d2h_gbs']:.3f}")
EOF
    finish d pass "STORE/LOAD GB/s (synchronized) beside pinned cudaMemcpy" $((SECONDS - t0))
  else
    finish d "pass (cpu stand-in)" "STORE/LOAD GB/s on the CPU backend; no pinned ceiling without a GPU" $((SECONDS - t0))
  fi
}

stage_e() { # prefill / decode vs ceilings
  local t0=$SECONDS
  if [ "$device" = cuda ] && have "$bin/bench_cuda"; then
    step e_default 120 "$bin/bench_cuda" --model "$model" --batches 1,16,64,256 --prefill 512 --steps 32
    step e_llama3_8b 150 "$bin/bench_cuda" --model synthetic:llama3-8b --no-ceilings --batches 1,64 --steps 32 --prefill 4096 \
      --prefill-kernels "$([ "${BRAID_CUDA_PREFILL:-}" = flash ] && echo flash,wmma || echo wmma)"
    python3 - "$work/logs/e_default.log" "$work/logs/e_llama3_8b.log" >> "$work/metrics/e.tsv" << 'EOF'
import json, sys
tf = None
for path, tag in zip(sys.argv[1:], ["default", "8b"]):
    for line in open(path):
        if not line.startswith("{"): continue
        r = json.loads(line)
        if r.get("bench") == "ceilings":
            tf = r["cublas_bf16_tflops"]; print(f"d2d_copy_gbs\t{r['d2d_copy_gbs']}\ncublas_tflops\t{tf}")
        elif r.get("bench") == "decode" and r.get("graphs") is True:
            print(f"{tag}_decode_b{r['batch']}_tok_s\t{r['tokens_per_s']}")
        elif r.get("bench") == "prefill":
            k = r.get("kernel", "flash")  # flash: the default kernel; wmma: the fallback, beside it
            p = f"{tag}_prefill_{r['tokens']}" + ("" if k == "flash" else "_" + k)
            print(f"{p}_tok_s\t{r['tokens_per_s']}\n{p}_tflops\t{r['tflops']}")
            if tf: print(f"{p}_vs_cublas\t{r['tflops'] / tf:.3f}")
EOF
    grep -q '"bench":"prefill"' "$work/logs/e_llama3_8b.log" && finish e pass "bench_cuda default GGUF + synthetic:llama3-8b" $((SECONDS - t0)) ||
      finish e fail "bench_cuda did not finish (logs/e_*)" $((SECONDS - t0))
  else
    # CPU stand-in: one timed generation of the synthetic small shape through the CLI
    have "$bin/braid" || { finish e "skipped: no braid binary" "" 0; return; }
    local s=$SECONDS
    if step e_standin_generate 120 "$bin/braid" generate --device cpu --model "$big_spec" --prompt "Benchmark prompt" --max-tokens $small_tokens --ignore-eos; then
      metric e standin_generate_s $((SECONDS - s))
      finish e "pass (cpu stand-in)" "braid generate on $big (bench_cuda needs a GPU)" $((SECONDS - t0))
    else finish e fail "braid generate failed (logs/e_standin_generate.log)" $((SECONDS - t0)); fi
  fi
}

# Braid's side of (f): N parallel sequences of TOKENS generated tokens each through braid batch (one
# engine, --max-running N, a pool that holds them all). Its own summary line gives the serving rate:
# generated tokens over prefill + decode time, the model load excluded (f_parse_braid reads it).
braid_parallel() {
  local n=$1 tokens=$2 dev=$3 file=$work/f_requests_$1.jsonl
  python3 -c "
import json
for i in range($n): print(json.dumps({'id': 'r%d' % i, 'prompt': 'Request %d: write a long story about a lighthouse keeper.' % i, 'max_tokens': $tokens, 'ignore_eos': True, 'temperature': 0}))" > "$file"
  "$bin/braid" batch --device "$dev" --model "$model" --input "$file" --output "$work/f_out_$n.jsonl" --max-running "$n" \
    --kv-blocks $((n * ((tokens + 64) / 16 + 2)))
}

# f_parse_braid LOG N: "TOK_S PROMPT_TOKENS_PER_SEQ" from braid batch's summary, nothing unless all N completed
f_parse_braid() {
  python3 - "$1" "$2" << 'EOF2'
import re, sys
text, n = open(sys.argv[1]).read(), int(sys.argv[2])
m = re.search(r"\[batch\] (\d+) requests \((\d+) completed, (\d+) rejected\) in [0-9.]+ s: ([0-9.]+) generated tok/s", text)
p = re.search(r"\[batch\] prompt tokens (\d+):", text)
if m and p and int(m.group(2)) == n: print(m.group(4), round(int(p.group(1)) / n))
EOF2
}

# f_unresolved DIR BINARY: the sonames BINARY needs that resolve from neither DIR nor the system, one a line
f_unresolved() { LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$2" 2>&1 | awk '/not found/ {print $1}' | sort -u; }

stage_f() { # llama.cpp CUDA beside Braid
  local t0=$SECONDS tokens=$small_tokens pls="1 16 64" npp=32
  [ "$mode" = rehearse ] && pls="1 2" # llama.cpp's CPU fallback on this loaded VM: ~1 token/s per sequence
  have "$bin/braid" || { finish f "skipped: no braid binary" "" 0; return; }
  local braid_ok=1
  for n in $pls; do
    if step "f_braid_$n" 60 braid_parallel "$n" "$tokens" "$device"; then
      local r; r=$(f_parse_braid "$work/logs/f_braid_$n.log" "$n")
      if [ -n "$r" ]; then metric f "braid_${n}seq_tok_s" "${r% *}"; npp=${r#* }; else braid_ok=0; fi
    else braid_ok=0; fi
  done
  metric f prompt_tokens_per_seq "$npp" # llama.cpp's prompts get Braid's mean prompt length
  # llama.cpp's CUDA build, staged beside the binaries (scripts/stage-llamacpp.sh pack): its own
  # libraries first on the path; libcuda.so.1 is the GPU machine's driver
  local llama=${stage_dir:+$stage_dir/llama.cpp}
  if [ -z "$llama" ] || ! have "$llama/llama-batched-bench"; then
    [ $braid_ok = 1 ] || { finish f fail "braid batch failed (logs/f_braid_*)" $((SECONDS - t0)); return; }
    finish f "skipped: llama.cpp CUDA binaries not staged (scripts/stage-llamacpp.sh pack)" "Braid's side measured: braid batch, $tokens tokens per sequence" $((SECONDS - t0))
    return
  fi
  # the path as it was (the stage's lib/, the image's CUDA libraries) stays behind llama.cpp's own
  local libpath=$llama${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} allowed="" b bad=""
  if [ "$mode" = rehearse ]; then
    # no driver here: the toolkit's libcuda stub lets the binaries load, ggml-cuda finds no device and
    # llama.cpp runs on its CPU backend — the command lines and parsers rehearsed, not the GPU
    allowed=libcuda.so.1
    local stub=${CUDA_HOME:-/usr/local/cuda}/lib64/stubs/libcuda.so
    if [ -f "$stub" ]; then mkdir -p "$work/cudastub" && ln -sf "$stub" "$work/cudastub/libcuda.so.1" && libpath=$libpath:$work/cudastub allowed=""; fi
  fi
  for b in "$llama/llama-batched-bench" "$llama/llama-bench" "$llama"/lib*.so*; do
    [ -e "$b" ] || continue
    bad="$bad $(f_unresolved "$libpath" "$b" | grep -vxF "${allowed:-//}" | tr '\n' ' ')"
  done
  bad=$(for x in $bad; do echo "$x"; done | sort -u | paste -sd ' ')
  metric f llama_cpp_unresolved_libs "${bad:-none}"
  if [ -n "${bad// /}" ]; then finish f fail "llama.cpp's libraries do not resolve: $bad" $((SECONDS - t0)); return; fi
  if [ -n "$allowed" ]; then # rehearsal without a libcuda stub: the libraries are checked, nothing can run
    finish f "pass (cpu stand-in)" "llama.cpp's staged libraries resolve (but libcuda.so.1); not run: no libcuda stub here" $((SECONDS - t0)); return
  fi
  local max_pl=${pls##* } per_seq=$(( (npp + tokens + 255) / 256 * 256 ))
  local bb=("$llama/llama-batched-bench" -m "$model" -ngl 99 -fa -c $((max_pl * per_seq)) -npp "$npp" -ntg "$tokens" -npl "${pls// /,}" --output-format jsonl)
  local lb=("$llama/llama-bench" -m "$model" -ngl 99 -fa 1 -p 512 -n 128 -r 2 -o jsonl)
  local bb_limit=60 lb_limit=40
  [ "$mode" = rehearse ] && lb=("$llama/llama-bench" -m "$model" -ngl 99 -fa 1 -p 8 -n "$tokens" -r 1 -o jsonl) bb_limit=120 lb_limit=60
  echo "LD_LIBRARY_PATH=$libpath ${bb[*]}" > "$work/logs/f_llama_commands.log"
  echo "LD_LIBRARY_PATH=$libpath ${lb[*]}" >> "$work/logs/f_llama_commands.log"
  # parallel sequences: prompt of Braid's mean length, $tokens generated per sequence, flash attention on
  step f_llama_batched $bb_limit env LD_LIBRARY_PATH="$libpath" "${bb[@]}"
  local rc_bb=$?
  # single stream: prefill (pp512) and decode (tg128), flash attention on
  step f_llama_bench $lb_limit env LD_LIBRARY_PATH="$libpath" "${lb[@]}"
  local rc_lb=$?
  python3 - "$work/logs/f_llama_batched.log" "$work/logs/f_llama_bench.log" "$work/metrics/f.tsv" >> "$work/metrics/f.tsv" << 'EOF2'
import json, sys
bb, lb, tsv = sys.argv[1:4]
braid = {}
for line in open(tsv):
    k, _, v = line.rstrip("\n").partition("\t")
    if k.startswith("braid_") and k.endswith("seq_tok_s"): braid[k[6:-9]] = float(v)
for line in open(bb, errors="replace"):
    if not line.startswith("{"): continue
    try: r = json.loads(line)
    except ValueError: continue
    pl = r["pl"]
    # Braid's definition: generated tokens over prefill + decode time
    rate = pl * r["tg"] / r["t"] if r["t"] > 0 else 0.0
    print(f"llama_cpp_{pl}seq_tok_s\t{rate:.1f}\nllama_cpp_{pl}seq_decode_tok_s\t{r['speed_tg']:.1f}")
    if str(pl) in braid and rate > 0: print(f"braid_over_llama_cpp_{pl}seq\t{braid[str(pl)] / rate:.3f}")
for line in open(lb, errors="replace"):
    if not line.startswith("{"): continue
    try: r = json.loads(line)
    except ValueError: continue
    kind = "pp%d" % r["n_prompt"] if r.get("n_prompt") else "tg%d" % r["n_gen"]
    print(f"llama_bench_{kind}_tok_s\t{r['avg_ts']:.1f}")
    if r.get("gpu_info"): print(f"llama_cpp_gpu\t{r['gpu_info']}")
EOF2
  local why=""
  [ $braid_ok = 1 ] || why="$why braid batch failed (logs/f_braid_*);"
  [ $rc_bb = 0 ] && grep -q '^llama_cpp_1seq_tok_s' "$work/metrics/f.tsv" || why="$why llama-batched-bench rc=$rc_bb (logs/f_llama_batched.log);"
  [ $rc_lb = 0 ] && grep -q '^llama_bench_tg' "$work/metrics/f.tsv" || why="$why llama-bench rc=$rc_lb (logs/f_llama_bench.log);"
  if [ "$mode" = gpu ] && grep -q 'failed to initialize CUDA' "$work/logs/f_llama_batched.log" "$work/logs/f_llama_bench.log" 2> /dev/null; then
    why="$why llama.cpp ran without the GPU (ggml_cuda_init failed: its figures are CPU ones);"
  fi
  if [ -n "$why" ]; then finish f fail "${why%;}" $((SECONDS - t0))
  elif [ "$mode" = gpu ]; then finish f pass "braid batch vs llama-batched-bench -fa (${pls// /\/} sequences, $npp-token prompts, $tokens generated), llama-bench pp512/tg128" $((SECONDS - t0))
  else finish f "pass (cpu stand-in)" "llama.cpp's staged CUDA build run on its CPU backend through the libcuda stub (${pls// /\/} sequences, $tokens tokens): commands and parsers checked" $((SECONDS - t0)); fi
}

stage_g() { # mission arms on the synthetic 8B: PBKV vs LRU, ForkKV, segment reuse, splice
  local t0=$SECONDS
  have "$bin/braid" && have "$bin/braid-bench" || { finish g "skipped: braid / braid-bench not built" "" 0; return; }
  # CPU stand-in: the default GGUF (int8) — the synthetic bf16 shape prefills too slowly on 2 cores
  local wf=1 scale=0.05 blocks=128 cap=1 g_model=$model
  [ "$mode" = gpu ] && wf=16 scale=0.5 blocks=512 cap=32 g_model=$big_spec
  for policy in lru pbkv; do
    g_arm_on pbkv || break
    [ "$(remaining)" -lt 60 ] || [ $((stage_end - SECONDS)) -lt 40 ] && break
    serve_start "g_$policy" --model "$g_model" --instances 1 --device $device --policy $policy --kv-blocks $blocks --host-kv-blocks 0 || continue
    step "g_$policy" 120 "$bin/braid-bench" run --workload codegen --url "$srv_url" --model "$g_model" --workflows $wf --concurrency 4 \
      --scale $scale --fixed-output --max-tokens-cap $cap --out "$work/g_$policy"
    local run_rc=$?
    local hit; hit=$(curl -s -m 10 "$srv_url/metrics" | awk '$1 ~ /^braid_prompt_tokens_cached_total/ {c += $2} $1 == "braid_prompt_tokens_computed_total" {p = $2} END {if (c + p > 0) printf "%.3f", c / (c + p)}')
    [ -n "$hit" ] && metric g "${policy}_hit_rate" "$hit"
    serve_stop
    # only a clean run's latency counts (braid-bench exits 1 when any request failed)
    [ $run_rc = 0 ] || { metric g "${policy}_run" "failed rc=$run_rc (logs/g_$policy.log)"; continue; }
    python3 - "$work/g_$policy/summary.json" "$policy" >> "$work/metrics/g.tsv" << 'EOF' 2> /dev/null
import json, sys
s = json.load(open(sys.argv[1]))
def find(d, key):
    if isinstance(d, dict):
        for k, v in d.items():
            if k == key: return v
            r = find(v, key)
            if r is not None: return r
for key in ("mean_workflow_latency_s", "workflow_latency_mean_s", "mean"):
    v = find(s, key)
    if isinstance(v, (int, float)): print(f"{sys.argv[2]}_workflow_latency_s\t{v}"); break
EOF
  done
  python3 - "$work/metrics/g.tsv" >> "$work/metrics/g.tsv" << 'EOF2' 2> /dev/null
import sys
m = dict(l.rstrip("\n").split("\t", 1) for l in open(sys.argv[1]))
if "lru_workflow_latency_s" in m and "pbkv_workflow_latency_s" in m:
    print(f"pbkv_speedup_vs_lru\t{float(m['lru_workflow_latency_s']) / float(m['pbkv_workflow_latency_s']):.3f}")
EOF2
  g_forkkv
  g_segment_reuse
  g_splice
  local arms; arms=$(grep -c -E '^(pbkv_workflow_latency_s|forkkv_shared_over_separate|seg_approx_ttft_mean_ms|splice_reprefill_over_splice)' "$work/metrics/g.tsv" 2> /dev/null)
  if [ "${arms:-0}" -ge 4 ]; then
    finish g "$([ "$mode" = gpu ] && echo pass || echo "pass (cpu stand-in)")" "PBKV vs LRU, ForkKV, segment reuse, splice on $g_model" $((SECONDS - t0))
  elif [ "${arms:-0}" -ge 1 ]; then
    finish g "$([ "$mode" = gpu ] && echo "partial" || echo "partial (cpu stand-in)")" "$arms of 4 arms measured on $g_model (the others: see metrics / logs/g_*)" $((SECONDS - t0))
  elif [ "$mode" = rehearse ]; then finish g "partial (cpu stand-in)" "no clean LRU + PBKV pair within the cap on this CPU (see the figures)" $((SECONDS - t0))
  else finish g fail "PBKV vs LRU runs did not complete (logs/g_*)" $((SECONDS - t0)); fi
}

# Stage g's arms after PBKV, each skipped (with a metric saying so) when the stage's time is short.
g_time_ok() { [ "$(remaining)" -gt $(($1 + 25)) ] && [ $((stage_end - SECONDS)) -gt "$1" ]; }
# G_ARMS (default "pbkv forkkv segment_reuse splice") picks the arms, e.g. to rehearse one alone.
g_arm_on() { [[ " ${G_ARMS:-pbkv forkkv segment_reuse splice} " == *" $1 "* ]]; }

g_forkkv() { # ForkKV shared vs separate at equal KV bytes, mapreduce-lora (bench/forkkv_live.sh)
  g_arm_on forkkv || return 0
  g_time_ok 60 || { metric g forkkv "skipped: out of time"; return; }
  # GPU: the synthetic 8B with random rank-16 adapters of its shape (kv_dim 1024 / rank 16 = RATIO 64);
  # CPU stand-in: the default GGUF and its committed adapters, tiny sizes
  local envs=(DEVICE=$device WORKLOADS=mapreduce-lora RUN_ARGS=--fixed-output)
  if [ "$mode" = gpu ]; then envs+=(BRAID_MODEL=$g_model ADAPTERS=synthetic LORA_RANK=16 RATIO=64 WORKFLOWS=8 CONCURRENCY=8
                                   FANOUT=4 CONTEXT_TOKENS=1024 SCALE=0.5 MAX_TOKENS_CAP=32 SEP_BLOCKS=320 RES_EQUIV=64)
  else envs+=(BRAID_MODEL=$model WORKFLOWS=1 CONCURRENCY=1 FANOUT=2 CONTEXT_TOKENS=64 SCALE=0.05 MAX_TOKENS_CAP=1 SEP_BLOCKS=96
              RES_EQUIV=16); fi
  step g_forkkv 110 env BRAID_BIN="$bin/braid" BENCH_BIN="$bin/braid-bench" "${envs[@]}" bash "$root/bench/forkkv_live.sh" "$work/g_forkkv"
  python3 - "$work/g_forkkv" >> "$work/metrics/g.tsv" << 'EOF2' 2> /dev/null
import json, os, sys
d = sys.argv[1]; v = {}
for arm in ("separate", "shared"):
    s = json.load(open(os.path.join(d, f"mapreduce-lora-{arm}", "summary.json")))
    if s.get("errors"): continue
    v[arm] = s["generated_tok_s"]
    print(f"forkkv_{arm}_tok_s\t{s['generated_tok_s']:.1f}\nforkkv_{arm}_workflow_latency_s\t{s['mean_workflow_latency_s']:.2f}")
if len(v) == 2 and v["separate"] > 0: print(f"forkkv_shared_over_separate\t{v['shared'] / v['separate']:.3f}")
EOF2
}

g_segment_reuse() { # segment reuse TTFT: off vs exact vs approx (bench/segment_reuse_live.sh --device)
  g_arm_on segment_reuse || return 0
  g_time_ok 60 || { metric g segment_reuse "skipped: out of time"; return; }
  local envs=(BRAID_BIN="$bin/braid" BRAID_BENCH_BIN="$bin/braid-bench" CONCURRENCY=1 APPEND=0)
  if [ "$mode" = gpu ]; then envs+=(BRAID_MODEL=$g_model MODES="off exact approx" WORKFLOWS=4 SCALE=0.5 MAX_TOKENS=8)
  else envs+=(BRAID_MODEL=$model MODES=approx WORKFLOWS=1 SCALE=0.05 MAX_TOKENS=1); fi # one round: the CPU is slow
  step g_segment_reuse 100 env "${envs[@]}" bash "$root/bench/segment_reuse_live.sh" --device $device "$work/g_segment_reuse"
  # table rows: | concurrency | mode | requests | TTFT mean | p50 | p90 | reused | prefix-cached | prompt |
  awk -F'|' '$3 ~ /^ (off|exact|approx) $/ {gsub(/ /, "", $3); gsub(/ /, "", $5); gsub(/ /, "", $7); gsub(/ /, "", $8);
    printf "seg_%s_ttft_mean_ms\t%s\nseg_%s_ttft_p90_ms\t%s\nseg_%s_reused_tokens\t%s\n", $3, $5, $3, $7, $3, $8}' \
    "$work/g_segment_reuse/table.md" >> "$work/metrics/g.tsv" 2> /dev/null
}

g_splice() { # a 1K-token splice vs recompute-from-the-edit vs full re-prefill in an 8K context (bench/splice_live.py)
  g_arm_on splice || return 0
  g_time_ok 45 || { metric g splice "skipped: out of time"; return; }
  local ctx=7168 span=1024 rounds=2
  [ "$mode" = gpu ] || { ctx=256 span=32 rounds=1; }
  serve_start g_splice --model "$g_model" --instances 1 --device $device || { metric g splice "failed: server did not start"; return; }
  step g_splice 90 python3 "$root/bench/splice_live.py" --url "$srv_url" --context-tokens $ctx --span-tokens $span --rounds $rounds
  serve_stop
  python3 - "$work/logs/g_splice.log" >> "$work/metrics/g.tsv" << 'EOF2' 2> /dev/null
import json, sys
for line in open(sys.argv[1]):
    if '"splice_live_summary"' in line:
        r = json.loads(line)
        for k in ("splice_s", "forget_s", "reprefill_s", "reprefill_over_splice", "forget_over_splice"):
            print(f"splice_{k}\t{r[k]:.3f}")
EOF2
}

# ---- run, in priority order ----
for s in a b c d e f g; do
  [[ " $only " == *" $s "* ]] || continue
  if [ "$(remaining)" -lt 30 ]; then finish $s "skipped: out of time (budget ${budget}s)" "" 0; continue; fi
  echo "gpu-suite: stage $s ($(remaining)s left, cap ${stage_cap[$s]}s)" >&2
  stage_end=$((SECONDS + stage_cap[$s]))
  "stage_$s"
  serve_stop
done

# ---- results ----
python3 - "$work/results.jsonl" "$OUT" "$mode" "$device" "$budget" $((SECONDS - t_start)) << 'EOF'
import json, os, platform, subprocess, sys, time
path, out, mode, device, budget, wall = sys.argv[1:7]
stages = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
gpu = ""
try:
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
except Exception:
    pass
doc = {"suite": "issue 34 gpu-suite", "mode": mode, "device": device, "gpu": gpu, "host": platform.node(),
       "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "budget_s": int(budget), "wall_s": int(wall), "stages": stages}
json.dump(doc, open(os.path.join(out, "gpu-suite.json"), "w"), indent=1)
lines = [f"gpu-suite ({mode}, {device}{', ' + gpu if gpu else ''}) {doc['date_utc']}, wall {wall}s of {budget}s", "",
         "| stage | status | s | figures |", "|---|---|---|---|"]
for s in stages:
    figs = ", ".join(f"{k}={v}" for k, v in s["metrics"].items() if not (isinstance(v, str) and v.startswith("skipped")))
    lines.append(f"| {s['stage']} | {s['status']} | {s['seconds']} | {figs[:300]} |")
open(os.path.join(out, "gpu-suite.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
tar -C "$work" -czf "$OUT/gpu-suite-logs.tar.gz" logs metrics 2> /dev/null
grep -q '"status": "fail' "$work/results.jsonl" && exit 1 || exit 0
