#!/usr/bin/env bash
# stage-llamacpp.sh — llama.cpp's CUDA build (sm_90) for stage (f) of scripts/gpu-suite.sh: built OUTSIDE
# the repository from the llama-cpp-python sdist on PyPI (it vendors llama.cpp's sources), checked, and
# staged inside the visit's payload (scripts/gpu-stage.sh pack, git-ignored .devstage/). Nothing of
# llama.cpp is ever committed. Re-run it in any later session: it builds only when no build is there.
#
#   scripts/stage-llamacpp.sh check              the build is usable on the GPU machine: llama-batched-bench and
#                                                llama-bench present, every library they need resolves from
#                                                the build or from the GPU image (../shared/device/device-libs.txt)
#                                                except libcuda.so.1 (the driver's, there), kernels for sm_90
#   scripts/stage-llamacpp.sh build              builds it when missing (nice 19; hours on a 2-core VM: run it
#                                                in the background), linking against the toolkit's libcuda stub
#   scripts/stage-llamacpp.sh collect [DIR]      copies exactly what the visit needs into DIR (default
#                                                $LLAMA_CPP_STAGE or /tmp/llamacpp-stage): the two binaries and
#                                                libllama.so + libggml*.so (never a libcuda), debug info stripped
#   scripts/stage-llamacpp.sh pack [BUILD_DIR]   check + collect + scripts/gpu-stage.sh pack BUILD_DIR with
#                                                LLAMA_CPP_BIN=DIR: one payload, Braid + model + llama.cpp
#   scripts/stage-llamacpp.sh rehearse [BUILD_DIR] [SUITE ARGS]
#                                                check + collect + scripts/gpu-stage.sh rehearse (default
#                                                BUILD_DIR build-gpu, a CPU build; default suite args --only f):
#                                                the payload unpacked as on the visit, stage (f) run with the
#                                                CPU stand-ins, llama.cpp on the CPU through the libcuda stub
# Env: LLAMA_CPP_DIR (the build is $LLAMA_CPP_DIR/build/bin; default the first of /tmp/llamacpp-gpuattn34,
#      /tmp/llama-cpp holding one, else /tmp/llama-cpp), LLAMA_CPP_PY_VERSION [0.3.16], LLAMA_CPP_JOBS [1].
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
version=${LLAMA_CPP_PY_VERSION:-0.3.16}
device_libs=${DEVICE_LIBS:-$root/../shared/device/device-libs.txt}
cuda_home=${CUDA_HOME:-/usr/local/cuda}
binaries=(llama-batched-bench llama-bench)

die() { echo "stage-llamacpp: $*" >&2; exit 1; }

llama_dir() {
  if [ -n "${LLAMA_CPP_DIR:-}" ]; then echo "$LLAMA_CPP_DIR"; return; fi
  local d
  for d in /tmp/llamacpp-gpuattn34 /tmp/llama-cpp; do
    [ -x "$d/build/bin/llama-batched-bench" ] && { echo "$d"; return; }
  done
  echo /tmp/llama-cpp
}
dir=$(llama_dir)
case "$dir" in "$root"|"$root"/*) die "LLAMA_CPP_DIR must be outside the repository" ;; esac
bindir=$dir/build/bin

# The libraries a binary or library needs that resolve neither from the build nor from the system
# here, one soname a line (ldd with the build's dir first, as LD_LIBRARY_PATH is set on the visit).
unresolved() { LD_LIBRARY_PATH="$bindir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$1" | awk '/not found/ {print $1}' | sort -u; }

# Sonames resolved from this system (not the build) that the GPU image lacks: they would be missing there.
missing_on_device() {
  [ -f "$device_libs" ] || return 0
  LD_LIBRARY_PATH="$bindir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$1" | awk '/=> \// {print $1" "$3}' |
    while read -r soname path; do
      case "$path" in "$bindir"/*) continue ;; esac
      grep -qxF "$soname" "$device_libs" || echo "$soname"
    done | sort -u
}

cmd_check() {
  local ok=1 f
  for f in "${binaries[@]}"; do [ -x "$bindir/$f" ] || { echo "stage-llamacpp: $bindir/$f missing" >&2; ok=0; }; done
  [ $ok = 1 ] || die "no usable build in $dir (scripts/stage-llamacpp.sh build)"
  for f in "${binaries[@]/#/$bindir/}" "$bindir"/lib*.so; do
    local bad; bad=$(unresolved "$f" | grep -vx 'libcuda.so.1' || true)
    [ -z "$bad" ] || { echo "stage-llamacpp: $(basename "$f") needs, unresolved: $bad" >&2; ok=0; }
    bad=$(missing_on_device "$f")
    [ -z "$bad" ] || { echo "stage-llamacpp: $(basename "$f") needs what the GPU image lacks: $bad" >&2; ok=0; }
  done
  local arch; arch=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$dir/build/CMakeCache.txt" 2> /dev/null)
  [[ ",$arch," == *,90,* || ",$arch," == *,90a,* || ",$arch," == *,90-real,* ]] || { echo "stage-llamacpp: CUDA architectures '$arch', not sm_90" >&2; ok=0; }
  grep -q '^GGML_CUDA:BOOL=ON' "$dir/build/CMakeCache.txt" 2> /dev/null || { echo "stage-llamacpp: the build is not GGML_CUDA=ON" >&2; ok=0; }
  [ $ok = 1 ] || die "the build in $dir is not usable on the GPU machine"
  echo "stage-llamacpp: $bindir ok (CUDA architectures $arch; every library resolves but libcuda.so.1, the driver's on the GPU machine)" >&2
}

# The toolkit's libcuda stub as libcuda.so.1 in a directory of its own (link time here; the rehearsal's
# CPU run, where ggml-cuda finds no device and llama.cpp falls back to its CPU backend).
stub_dir() {
  local stub=$cuda_home/lib64/stubs/libcuda.so d=$1
  [ -f "$stub" ] || return 1
  mkdir -p "$d" && ln -sf "$stub" "$d/libcuda.so.1"
}

cmd_build() {
  if [ -x "$bindir/llama-batched-bench" ] && [ -x "$bindir/llama-bench" ]; then
    echo "stage-llamacpp: already built in $bindir" >&2; return 0
  fi
  if pgrep -f "cmake --build $dir/build" > /dev/null; then die "a build of $dir/build is running: wait for it"; fi
  mkdir -p "$dir"
  local sdist=$dir/llama_cpp_python-$version.tar.gz src=$dir/llama_cpp_python-$version/vendor/llama.cpp
  [ -f "$sdist" ] || pip download --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$dir" >&2
  [ -f "$sdist" ] || die "no sdist $sdist after pip download"
  [ -d "$src" ] || tar -C "$dir" -xzf "$sdist"
  stub_dir "$dir/cudastub" || die "no libcuda stub under $cuda_home/lib64/stubs"
  # libggml-cuda.so needs libcuda.so.1 (VMM pool): no driver here, so the executables link through the stub
  nice -n 19 cmake -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$dir/cudastub" > "$dir/cmake.log"
  local t0=$SECONDS
  nice -n 19 cmake --build "$dir/build" -j"${LLAMA_CPP_JOBS:-1}" --target "${binaries[@]}"
  echo "stage-llamacpp: built in $((SECONDS - t0)) s in $bindir" >&2
  cmd_check
}

cmd_collect() {
  local dest=${1:-${LLAMA_CPP_STAGE:-/tmp/llamacpp-stage}}
  case "$dest" in "$root"|"$root"/*) die "collect into a directory outside the repository" ;; esac
  rm -rf "$dest" && mkdir -p "$dest"
  cp "${binaries[@]/#/$bindir/}" "$dest/"
  local lib
  for lib in "$bindir"/libllama.so* "$bindir"/libggml*.so*; do [ -e "$lib" ] && cp -P "$lib" "$dest/"; done
  strip --strip-debug "$dest"/* 2> /dev/null || true
  ! ls "$dest" | grep -q '^libcuda' || die "a libcuda in $dest: it would shadow the GPU machine's driver"
  echo "stage-llamacpp: collected $(ls "$dest" | wc -l) files, $(du -sh "$dest" | cut -f1), in $dest" >&2
  echo "$dest"
}

case "${1:-}" in
  check) cmd_check ;;
  build) cmd_build ;;
  collect) shift; cmd_check; cmd_collect "$@" > /dev/null ;;
  pack)
    shift; cmd_check
    stage=$(cmd_collect)
    LLAMA_CPP_BIN=$stage "$root/scripts/gpu-stage.sh" pack "$@" ;;
  rehearse)
    shift; cmd_check
    stage=$(cmd_collect)
    build=${1:-build-gpu}; [ $# -gt 0 ] && shift
    [ $# -gt 0 ] || set -- --only f
    LLAMA_CPP_BIN=$stage "$root/scripts/gpu-stage.sh" rehearse "$build" "$@" ;;
  *) sed -n '2,24p' "$0"; exit 2 ;;
esac
