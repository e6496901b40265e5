#!/usr/bin/env bash
# Download what scripts/gpu-check.sh installs on a GPU machine without network into
# gpu-wheels/ (git-ignored; the device tool carries it, 64 MB at most): flashinfer-python
# without its dependencies, and scripts/gpu-requirements.txt with theirs, as Linux x86_64
# wheels for each Python version in GPU_PYTHONS. torch, numpy and nvidia-* wheels are dropped:
# the GPU machine has its own.
# Usage: scripts/gpu-wheels.sh   (GPU_PYTHONS="3.12" narrows it; PIP=path/to/pip)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${GPU_WHEELS:-$ROOT/gpu-wheels}"
PIP="${PIP:-pip}"
LIMIT_MB=62
FLASHINFER="flashinfer-python==0.6.13"  # the version pyproject's gpu extra pins
read -r -a VERSIONS <<< "${GPU_PYTHONS:-3.10 3.11 3.12 3.13}"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

mkdir -p "$DEST"
for version in "${VERSIONS[@]}"; do
  "$PIP" download -q --only-binary=:all: --python-version "$version" "${PLATFORMS[@]}" \
    -d "$DEST" -r "$ROOT/scripts/gpu-requirements.txt"
done
"$PIP" download -q --no-deps -d "$DEST" "$FLASHINFER"
rm -f "$DEST"/numpy-* "$DEST"/torch-* "$DEST"/nvidia_*cu* "$DEST"/triton-*
size=$(du -sm "$DEST" | cut -f1)
echo "gpu-wheels: ${size} MB in $DEST"
if [ "$size" -gt "$LIMIT_MB" ]; then
  echo "gpu-wheels: over ${LIMIT_MB} MB: set GPU_PYTHONS to the GPU machine's Python only" >&2
  exit 1
fi
