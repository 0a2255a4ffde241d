#!/usr/bin/env bash
# gpu-stage.sh — prepares issue 34's GPU visit (scripts/gpu-suite.sh) on this machine and receives
# it on the lent one, within the device rules of ../shared/device/README.md: a run brings at most
# 64 MiB of ignored files (carry), the machine keeps /tmp only while it stays in use (~30 s idle).
#
# Here (development machine):
#   scripts/gpu-stage.sh build [BUILD_DIR]   configure + build the CUDA tree for sm_90a (default build-gpu-cuda)
#   scripts/gpu-stage.sh pack  [BUILD_DIR]   one payload: bin/ (braid, braid-bench, the benches, the GPU
#                                            tests), lib/ (sonames the GPU image lacks, per device-libs.txt),
#                                            model.gguf (the default model), llama.cpp/ ($LLAMA_CPP_BIN, if
#                                            set: llama.cpp's CUDA binaries built outside the repo, as
#                                            scripts/stage-llamacpp.sh collects them; it runs this pack);
#                                            zstd-compressed and split into .devstage/part-aa, -ab, ... of
#                                            at most 60 MiB, + .devstage/SHA256; prints the run commands
# There (each run carries one part; the repository's scripts travel with the working tree):
#   scripts/gpu-stage.sh receive             appends every .devstage/part-* this run brought to
#                                            $GPU_STAGE_TMP/payload.tar.zst (default /tmp/gpu-stage)
#   scripts/gpu-stage.sh unpack              checks the SHA256 and unpacks into $GPU_STAGE_TMP/root
#   scripts/gpu-stage.sh visit               receive + unpack + scripts/gpu-suite.sh --stage ROOT
# Optional, here: scripts/gpu-stage.sh llama   = scripts/stage-llamacpp.sh build: llama.cpp's CUDA binaries
#                                            (llama-batched-bench, llama-bench; sm_90 only, shared libraries)
#                                            OUTSIDE the repo from the llama-cpp-python sdist on PyPI, at
#                                            nice 19; then scripts/stage-llamacpp.sh pack (checks, collects,
#                                            packs). Nothing of llama.cpp is ever committed.
# Rehearsal here, end to end: scripts/gpu-stage.sh rehearse [BUILD_DIR] packs (BUILD_DIR default
# build-gpu, a CPU build), receives each part as separate runs would, unpacks into a temporary
# GPU_STAGE_TMP and runs the suite in --rehearse mode from the unpacked payload.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tmp=${GPU_STAGE_TMP:-/tmp/gpu-stage}
part_bytes=$((60 * 1024 * 1024))
device_libs=${DEVICE_LIBS:-$root/../shared/device/device-libs.txt}
bins=(braid braid-bench bench_cuda bench_cache_ops bench_kv_move bench_rotate)
tests=(test_attention_prefill_cuda test_synthetic_cuda test_cuda_kv_ipc test_cache_paths_cuda test_cuda_backend test_rotate test_residual_attention_cuda test_grammar_mask_cuda test_lora_cuda
       test_arch_cuda test_engine_grammar test_engine test_synthetic_model test_kv_stage_pipe test_kv_stage_wire)
model=${BRAID_MODEL:-$root/models/SmolLM2-135M-Instruct.Q4_1.gguf}

exclude_devstage() {
  local git_dir; git_dir=$(git rev-parse --git-dir)
  mkdir -p "$git_dir/info"
  grep -qxF "/.devstage/" "$git_dir/info/exclude" 2> /dev/null || echo "/.devstage/" >> "$git_dir/info/exclude"
}

cmd_build() {
  local dir=${1:-build-gpu-cuda}
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DBRAID_CUDA=ON -DBRAID_CUDA_ARCHITECTURES=90a -DBRAID_MARCH=x86-64-v3 > "$dir.cmake.log"
  cmake --build "$dir" -j"$(nproc)" --target "${bins[@]}" "${tests[@]}"
}

# llama.cpp's CUDA build for suite stage (f), outside the repository. The two targets only, FA
# kernels for the default quant types only (GGML_CUDA_FA_ALL_QUANTS=OFF), one architecture.
# (The build, its libcuda stub link and its checks live in scripts/stage-llamacpp.sh.)
cmd_llama() { "$root/scripts/stage-llamacpp.sh" build; }

# Copies the libraries the binaries need that the GPU image lacks into $1.
stage_libs() {
  local dest=$1; shift
  mkdir -p "$dest"
  [ -f "$device_libs" ] || { echo "gpu-stage: $device_libs not found: staging no libraries" >&2; return 0; }
  for f in "$@"; do
    ldd "$f" 2> /dev/null | awk '/=> \//{print $1" "$3}' | while read -r soname path; do
      grep -qxF "$soname" "$device_libs" || cp -Lu "$path" "$dest/"
    done
  done
}

cmd_pack() {
  local dir=${1:-build-gpu-cuda}
  [ -d "$dir" ] || { echo "gpu-stage: no build dir $dir (scripts/gpu-stage.sh build first)" >&2; exit 1; }
  [ -f "$model" ] || { echo "gpu-stage: no model $model (scripts/fetch-model.sh)" >&2; exit 1; }
  local pay; pay=$(mktemp -d /tmp/gpu-pack.XXXXXX)
  mkdir -p "$pay/bin" "$pay/lib"
  local have=() missing=()
  for b in "${bins[@]}"; do if [ -x "$dir/$b" ]; then cp "$dir/$b" "$pay/bin/"; have+=("$b"); else missing+=("$b"); fi; done
  for t in "${tests[@]}"; do if [ -x "$dir/tests/$t" ]; then cp "$dir/tests/$t" "$pay/bin/"; have+=("$t"); else missing+=("$t"); fi; done
  strip --strip-debug "$pay"/bin/* 2> /dev/null || true
  stage_libs "$pay/lib" "$pay"/bin/*
  cp "$model" "$pay/model.gguf"
  if [ -n "${LLAMA_CPP_BIN:-}" ]; then
    mkdir -p "$pay/llama.cpp"
    cp "$LLAMA_CPP_BIN"/llama-batched-bench "$LLAMA_CPP_BIN"/llama-bench "$pay/llama.cpp/" ||
      { echo "gpu-stage: llama.cpp binaries missing in $LLAMA_CPP_BIN" >&2; exit 1; }
    # its own shared libraries only (stage (f) sets LD_LIBRARY_PATH to them); never a libcuda: the
    # GPU machine's driver provides libcuda.so.1, a stub staged beside it would shadow the driver
    local lib
    for lib in "$LLAMA_CPP_BIN"/libllama.so* "$LLAMA_CPP_BIN"/libggml*.so*; do [ -e "$lib" ] && cp -P "$lib" "$pay/llama.cpp/"; done
    strip --strip-debug "$pay"/llama.cpp/* 2> /dev/null || true
    echo "llama.cpp: $(ls "$pay/llama.cpp" | tr '\n' ' ')($(du -sh "$pay/llama.cpp" | cut -f1))" >&2
  fi
  printf '%s\n' "${have[@]}" > "$pay/STAGED"
  exclude_devstage
  rm -rf .devstage && mkdir -p .devstage
  tar -C "$pay" -cf - . | zstd -q -T0 -10 --long=27 -o .devstage/payload.tar.zst
  rm -rf "$pay"
  (cd .devstage && sha256sum payload.tar.zst > SHA256 && split -b "$part_bytes" -a 2 payload.tar.zst part- && rm payload.tar.zst)
  local parts; parts=$(ls .devstage/part-* | wc -l)
  echo "staged ${#have[@]} binaries${missing:+, not built: ${missing[*]}}" >&2
  ls -la .devstage >&2
  echo "payload in $parts part(s) of at most 60 MiB. The visit, one device run per part:" >&2
  local i=0
  for p in .devstage/part-*; do
    i=$((i + 1))
    if [ "$i" -lt "$parts" ]; then
      echo "  run $i: carry [\"$p\"]  command: scripts/gpu-stage.sh receive" >&2
    else
      echo "  run $i: carry [\"$p\", \".devstage/SHA256\"]  command: scripts/gpu-stage.sh visit" >&2
    fi
  done
  # the default model alone is ~88 MiB compressed: 2 parts; llama.cpp's CUDA libraries add ~31 MiB: 3 parts
  local plan=2; [ -n "${LLAMA_CPP_BIN:-}" ] && plan=3
  [ "$parts" -le "$plan" ] || echo "gpu-stage: WARNING: $parts parts; the visit plan allows $plan runs (stage runs + the last one)" >&2
}

cmd_receive() {
  mkdir -p "$tmp"
  touch "$tmp/received"
  for p in .devstage/part-*; do
    [ -f "$p" ] || continue
    local name; name=$(basename "$p")
    grep -qxF "$name" "$tmp/received" && continue
    cat "$p" >> "$tmp/payload.tar.zst"
    echo "$name" >> "$tmp/received"
  done
  echo "gpu-stage: received $(tr '\n' ' ' < "$tmp/received")($(du -h "$tmp/payload.tar.zst" | cut -f1))" >&2
}

cmd_unpack() {
  [ -f .devstage/SHA256 ] || { echo "gpu-stage: .devstage/SHA256 not brought along" >&2; exit 1; }
  (cd "$tmp" && sha256sum -c --quiet "$root/.devstage/SHA256") || { echo "gpu-stage: payload checksum mismatch (a part missing?)" >&2; exit 1; }
  rm -rf "$tmp/root" && mkdir -p "$tmp/root"
  zstd -q -d --long=27 -c "$tmp/payload.tar.zst" | tar -C "$tmp/root" -xf -
  echo "gpu-stage: unpacked $(wc -l < "$tmp/root/STAGED") binaries into $tmp/root" >&2
}

cmd_visit() {
  cmd_receive
  cmd_unpack
  "$root/scripts/gpu-suite.sh" --stage "$tmp/root" "$@"
}

cmd_rehearse() {
  local dir=${1:-build-gpu}
  cmd_pack "$dir"
  local parts=(.devstage/part-*) saved; saved=$(mktemp -d /tmp/gpu-parts.XXXXXX)
  export GPU_STAGE_TMP; GPU_STAGE_TMP=$(mktemp -d /tmp/gpu-stage-rehearse.XXXXXX)
  tmp=$GPU_STAGE_TMP
  mv .devstage/part-* "$saved/"
  for p in "${parts[@]}"; do # each part arrives in its own run, as on the device
    mv "$saved/$(basename "$p")" .devstage/
    cmd_receive
    mv ".devstage/$(basename "$p")" "$saved/"
  done
  mv "$saved"/part-* .devstage/ && rmdir "$saved"
  cmd_unpack
  local rc=0
  "$root/scripts/gpu-suite.sh" --rehearse --stage "$tmp/root" "${@:2}" || rc=$?
  rm -rf "$tmp"
  return $rc
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  llama) cmd_llama ;;
  pack) shift; cmd_pack "$@" ;;
  receive) cmd_receive ;;
  unpack) cmd_unpack ;;
  visit) shift; cmd_visit "$@" ;;
  rehearse) shift; cmd_rehearse "$@" ;;
  *) sed -n '2,27p' "$0"; exit 2 ;;
esac
