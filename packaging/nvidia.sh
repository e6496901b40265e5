#!/bin/sh
# Exit 0 when this is a Linux machine with an NVIDIA GPU (its driver loaded, or nvidia-smi
# present), else 1. FERRY_GPU=1 or FERRY_GPU=0 decides instead (e.g. to install the CPU build
# on a GPU machine). install.sh and the Makefile use it to pick the CUDA torch and the `gpu`
# extra (FlashInfer) over the CPU build.
case "${FERRY_GPU:-}" in
  1) exit 0 ;;
  0) exit 1 ;;
esac
[ "$(uname -s)" = Linux ] || exit 1
[ -e /proc/driver/nvidia/version ] && exit 0
command -v nvidia-smi >/dev/null 2>&1 && exit 0
exit 1
