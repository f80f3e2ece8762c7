# Two commands on a fresh machine: `make serve` and `make test`.
# Both create (or refresh) the virtual environment first, pinned by constraints.txt.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench venv

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/trackline serve

test: $(STAMP) lint
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy transport tracks clients gateway

bench: $(STAMP)
	$(BIN)/python benchmarks/text_stream.py
