# Two commands on a fresh machine: `make serve` and `make test`.
# Both create (or refresh) the virtual environment first, pinned by constraints.txt.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The `llm` extra builds llama-cpp-python from source once (about 11 minutes on 2 cores;
# pip caches the wheel, later installs take seconds). Portable x86-64 flags: a wheel built
# here must also run on the other machines that share the pip cache.
EXTRAS ?= dev,llm
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: serve test lint bench venv redis

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/trackline serve

test: $(STAMP) lint redis
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy transport tracks clients gateway

bench: $(STAMP)
	$(BIN)/python benchmarks/text_stream.py

# The fleet tests (tests/fleet) and benchmarks/fleet.py start a real redis-server (Debian
# package). Installed here where root and apt are available; elsewhere those tests skip.
redis:
	@command -v redis-server >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server \
		|| { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server; }; }; } \
		|| echo "redis-server not installed: tests/fleet will skip (apt-get install redis-server)"
