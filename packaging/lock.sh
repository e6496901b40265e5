#!/usr/bin/env bash
# Refresh locks/: the exact versions Ferry is tested with and ships, for each platform it
# supports, resolved by uv from pyproject.toml's ranges (`make lock` runs this).
#   <platform>.txt      what Ferry runs on: install.sh, the bundle and `ferry doctor` read it
#   dev/<platform>.txt  the same versions plus the dev and bundle tools: `make run` / `make test`
# uv keeps the versions the locks already hold where the ranges allow; to move on, pass uv's
# options through: `make lock ARGS=--upgrade` (all) or `ARGS="--upgrade-package transformers"`.
# The torch release is chosen in locks/torch.in and locks/torch-cpu.in (a new one is a reviewed
# change, like any lock refresh).
# Linux x86_64 has a CPU lock (torch's +cpu build, from the PyTorch CPU index) and a CUDA one
# (PyPI's Linux torch is the CUDA build); macOS arm64 and Windows get PyPI's torch.
# Where the PyTorch index cannot be reached, set TORCH_CPU_FIND_LINKS to a folder (or page)
# holding that +cpu torch wheel: the CPU lock then takes torch from there instead.
set -euo pipefail
UV_ARGS=("$@")

PYTHON_VERSION=3.11
UV="${UV:-uv}"
TORCH_CPU_FIND_LINKS="${TORCH_CPU_FIND_LINKS:-}"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# compile NAME PLATFORM TORCH_IN [ARGS...]: locks/NAME.txt, then locks/dev/NAME.txt within it
compile() {
  local name="$1" platform="$2" torch="$3"
  shift 3
  local common=(--python-version "$PYTHON_VERSION" --python-platform "$platform"
                --custom-compile-command "make lock" --quiet "${UV_ARGS[@]}" "$@")
  "$UV" pip compile pyproject.toml "${common[@]}" -c "$torch" -o "locks/$name.txt"
  "$UV" pip compile pyproject.toml "${common[@]}" --extra dev --extra bundle \
    -c "locks/$name.txt" -o "locks/dev/$name.txt"
}

cpu_torch=(--torch-backend cpu)  # uv's name for the PyTorch CPU index
if [ -n "$TORCH_CPU_FIND_LINKS" ]; then cpu_torch=(--find-links "$TORCH_CPU_FIND_LINKS"); fi

mkdir -p locks/dev
compile linux-x86_64-cpu x86_64-manylinux_2_28 locks/torch-cpu.in "${cpu_torch[@]}"
compile linux-x86_64-cuda x86_64-manylinux_2_28 locks/torch.in --extra gpu
# torch wheels for macOS need 14 (Sonoma) or newer
MACOSX_DEPLOYMENT_TARGET=14.0 compile macos-arm64 aarch64-apple-darwin locks/torch.in
compile windows-x86_64 x86_64-pc-windows-msvc locks/torch.in
echo "locks/ refreshed: review the diff, then run make test"
