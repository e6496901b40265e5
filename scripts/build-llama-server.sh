#!/usr/bin/env bash
# Build llama.cpp's llama-server, llama-perplexity and llama-quantize for the CPU: the peer that
# docs/benchmarks.md compares Ferry with.
#
#   scripts/build-llama-server.sh LLAMA_CPP_GIT [OUT_DIR] [--avx2]
#
# LLAMA_CPP_GIT is a clone of https://github.com/ggml-org/llama.cpp (or any copy of its history);
# the build checks out the commit the records name (build b10470) into OUT_DIR/llama.cpp.
# OUT_DIR defaults to llama-peer in the system temp folder. --avx2 builds the AVX2-only peer
# (no AVX-512, no VNNI) to compare with FERRY_CPU=avx2; the default builds for this CPU.
# On CPUs with AMX the build leaves llama.cpp's AMX path out: it stopped with SIGILL (tilezero)
# on the virtual machines of the records. Takes about 12 minutes on two cores.
set -euo pipefail
SRC=${1:?usage: build-llama-server.sh LLAMA_CPP_GIT [OUT_DIR] [--avx2]}
OUT=${2:-$(python3 -c 'import os, tempfile; print(os.path.join(tempfile.gettempdir(), "llama-peer"))')}
FLAVOUR=${3:-native}
COMMIT=34af94cd9ab277632e27caeec2d41de2fd091b31  # build b10470, 2026-08-17

mkdir -p "$OUT"
if [ ! -d "$OUT/llama.cpp/.git" ]; then
  git clone -q --no-checkout "$SRC" "$OUT/llama.cpp"
fi
git -C "$OUT/llama.cpp" checkout -q -f "$COMMIT"

BUILD=build
FLAGS=(-DGGML_NATIVE=ON)
if [ "$FLAVOUR" = "--avx2" ]; then
  BUILD=build-avx2
  FLAGS=(-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
elif grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
  NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  FLAGS+=(-DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX")
fi

cd "$OUT/llama.cpp"
cmake -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF "${FLAGS[@]}" \
      > "$OUT/cmake-$BUILD.log"
nice cmake --build "$BUILD" -j"$(nproc)" \
      --target llama-server llama-perplexity llama-quantize > "$OUT/$BUILD.log"
echo "built: $OUT/llama.cpp/$BUILD/bin/{llama-server,llama-perplexity,llama-quantize}"
echo "serve a model as the records do (one chat: -np 1; 32 at once: -np 32):"
echo "  $OUT/llama.cpp/$BUILD/bin/llama-server -m MODEL.gguf -t $(nproc) -np 32 -c 16384 \\"
echo "      --host 127.0.0.1 --port 8080 --metrics"
