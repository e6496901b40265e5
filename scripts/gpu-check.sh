#!/usr/bin/env bash
# Prove Ferry's CUDA path on one GPU machine without network (docs/gpu.md):
#   1. a venv over the machine's own torch, filled offline from gpu-wheels/ (`make gpu-wheels`
#      on a machine with network downloads them; the working tree carries them),
#   2. FlashInfer's kernels built once (nvcc), timed apart from everything else,
#   3. the CUDA tests (FlashInfer vs torch parity; the executor vs the CPU float32 reference,
#      a sampled speculative round, a grammar round),
#   4. the throughput of the default model's shape on both attention backends,
#   5. everything gathered into OUT/results.json.
# Usage: scripts/gpu-check.sh [OUT] [STEPS]   (OUT: results folder, default $OUT or
#        ./gpu-results; STEPS: any of "install kernels tests bench", default all of them)
# Each step has its own time limit, and a failed step does not stop the others.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUTDIR="${1:-${OUT:-$ROOT/gpu-results}}"
STEPS="${2:-install kernels tests bench}"
WHEELS="${FERRY_GPU_WHEELS:-$ROOT/gpu-wheels}"
PYTHON="${PYTHON:-python3}"
# the venv and FlashInfer's JIT cache live in git-ignored folders of the working tree, which
# the device machine keeps between calls: a second call reuses the built kernels
VENV="${FERRY_GPU_VENV:-$ROOT/.gpu-venv}"
export FLASHINFER_WORKSPACE_BASE="${FLASHINFER_WORKSPACE_BASE:-$ROOT/.gpu-cache}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"  # FlashInfer's ninja builds in parallel
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUTDIR" "$FLASHINFER_WORKSPACE_BASE"
STEPLOG="$OUTDIR/steps.jsonl"

# run STEP LIMIT CMD...: the command's output to OUT/STEP.txt, its status and time to
# steps.jsonl
step() {
  local name="$1" limit="$2"
  shift 2
  local start end rc
  start=$(date +%s%N)
  echo "== $name (at most ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$OUTDIR/$name.txt" 2>&1
  rc=$?
  end=$(date +%s%N)
  tail -n 15 "$OUTDIR/$name.txt"
  local ms=$(( (end - start) / 1000000 ))
  printf '{"step": "%s", "rc": %d, "seconds": %d.%03d}\n' "$name" "$rc" \
    $(( ms / 1000 )) $(( ms % 1000 )) >> "$STEPLOG"
  return "$rc"
}

wanted() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

install_wheels() {
  if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV" || return 1
  fi
  local pip=("$VENV/bin/python" -m pip install --no-index --find-links "$WHEELS"
             --disable-pip-version-check)
  # FlashInfer without its heavy dependencies (kernels Ferry does not use), then the rest
  "${pip[@]}" --no-deps flashinfer-python || echo "flashinfer-python: not installed"
  "${pip[@]}" -r "$ROOT/scripts/gpu-requirements.txt"
  "$VENV/bin/python" -c "import torch, transformers, gguf, llguidance, pytest; \
print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.is_available())"
  "$VENV/bin/python" -c "import flashinfer; print('flashinfer', flashinfer.__version__)" \
    || echo "flashinfer does not import: the torch backend only"
}

: > "$STEPLOG"
nvidia-smi > "$OUTDIR/nvidia-smi.txt" 2>&1 || true
if wanted install; then
  # a function under `timeout` runs in a shell of its own, with the variables it reads
  export VENV WHEELS PYTHON ROOT
  step install 240 bash -c "$(declare -f install_wheels); install_wheels"
fi
PY="$VENV/bin/python"
[ -x "$PY" ] || PY="$PYTHON"
step env 60 "$PY" "$ROOT/scripts/gpu_check.py" env "$OUTDIR"
if wanted kernels; then
  step kernels 420 "$PY" "$ROOT/scripts/gpu_check.py" kernels "$OUTDIR"
fi
if wanted tests; then
  step tests 300 "$PY" -m pytest -q -p no:cacheprovider -m cuda -o addopts="" \
    --junitxml="$OUTDIR/pytest.xml" \
    "$ROOT/tests/engine/execution/attention/test_flashinfer_parity.py" \
    "$ROOT/tests/engine/execution/test_cuda_engine.py"
  # the GPU block kernels, compiled by Triton for the device (on a CPU they run interpreted)
  step quant 240 "$PY" -m pytest -q -p no:cacheprovider -o addopts="" \
    --junitxml="$OUTDIR/pytest-quant.xml" \
    "$ROOT/tests/engine/kernels/test_gpu_quant_kernels.py" \
    "$ROOT/tests/engine/execution/model/test_gpu_quant_model.py"
fi
if wanted bench; then
  step bench 300 "$PY" "$ROOT/scripts/gpu_check.py" bench "$OUTDIR"
fi
"$PY" "$ROOT/scripts/gpu_check.py" collect "$OUTDIR"
