#!/usr/bin/env bash
# Installs what Braid needs on Debian 12 / Ubuntu (apt), fetches the default model, and builds.
#   scripts/setup.sh [BUILD_DIR] [extra cmake args...]
# Idempotent: packages already present and a model that already verifies are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true

packages=(build-essential cmake pkg-config python3 python3-pip python3-venv curl
          libopenblas-openmp-dev libcmocka-dev libjansson-dev libxxhash-dev
          openmpi-bin libopenmpi-dev libmicrohttpd-dev libzmq3-dev libcurl4-openssl-dev gnuplot-nox libhwloc-dev libucx-dev ucx-utils
          slurmd slurmctld slurm-client munge)  # Slurm: launch/braid.sbatch and its test against a local Slurm
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

scripts/fetch-model.sh

echo "[setup] building in $build_dir"
cmake -S . -B "$build_dir" "$@" > "$build_dir.cmake.log" 2>&1 || { cat "$build_dir.cmake.log"; exit 1; }
cmake --build "$build_dir" -j"$(nproc)"
