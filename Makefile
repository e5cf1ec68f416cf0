# The two commands of the README, and the checks around them.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin

# The suite starts hundreds of Python processes (sidecars, simulators, commands): where the
# environment says not to write bytecode, each would compile the project and its libraries
# again, and pytest would rewrite every test module's asserts in each worker.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test install dev lint bench

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# uv resolves and installs in a quarter of pip's time (17 s against 65 s for the dev extras on
# 2 cores); where uv cannot be had, pip does the same install.
PIP_INSTALL = { $(BIN)/pip install --quiet uv && $(BIN)/uv pip install --quiet \
	--python $(BIN)/python $(1); } || $(BIN)/pip install --quiet $(1)

install: $(BIN)/python
	$(call PIP_INSTALL,-e .)

dev: $(BIN)/python
	$(call PIP_INSTALL,-e '.[dev]')

# Command 1: the sidecar in front of a simulated 3-GPU fleet, embedded state; with the
# official ollama client, which the demo's banner and the README's examples use.
demo: install
	$(call PIP_INSTALL,ollama)
	$(BIN)/kubemoot-proxy serve --demo

# Command 2: dev dependencies, lint, types, tests. mypy checks the types beside the parallel
# pass (its ~20 s of CPU from cold fit where the workers wait); its verdict follows the tests'.
test: dev
	$(BIN)/ruff check proxy loadtest tests
	@types=$$(mktemp); $(BIN)/mypy > $$types 2>&1 & mypy=$$!; \
	$(BIN)/pytest -n 3 --dist worksteal -m "not serial"; tested=$$?; \
	wait $$mypy; typed=$$?; echo "mypy:"; cat $$types; rm -f $$types; \
	[ $$tested -eq 0 ] && [ $$typed -eq 0 ]
	$(BIN)/pytest -m serial

lint:
	$(BIN)/ruff check proxy loadtest tests
	$(BIN)/mypy

bench: dev
	$(BIN)/python -m loadtest.relay_bench
