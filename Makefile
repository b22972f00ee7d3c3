# Two commands for a fresh machine (README.md):
#   make serve   set up .venv and run the server (eager on the CPU where there is no GPU)
#   make test    set up .venv and run lint, type checks and the test suite (.ci/run runs this)
#
# torch is installed first and on its own: a plain `pip install torch` would pick the newest
# (CUDA) build; TORCH lets a machine choose, e.g. `make serve TORCH='torch --index-url …/cpu'`.

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin

.PHONY: serve test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.torch: | $(BIN)/python
	$(BIN)/pip install -q $(TORCH)
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

serve: $(VENV)/.installed
	$(BIN)/cudagraph-serve serve

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check app models loadtest tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV)
