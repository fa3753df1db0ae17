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

.PHONY: setup demo test test-fast bench clean

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade "pip>=24"
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	$(BIN)/pip check
	touch $(STAMP)

demo: setup
	$(BIN)/strata index data --index $(INDEX)
	$(BIN)/strata inspect --index $(INDEX)

test: setup
	$(BIN)/python -m pytest -q -ra tests

test-fast: setup
	$(BIN)/python -m pytest -q -ra -m "not slow" tests

bench: setup
	$(BIN)/python benchmarks/bench_index.py

clean:
	rm -rf $(INDEX) .pytest_cache
