# Two commands a new user needs: `make demo` and `make test`. Both create (or reuse) .venv and
# install what they need first. torch is pinned in pyproject.toml to the CPU build kept on disk.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-all install bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/oarctl run -c configs/demo.yaml --run-dir runs/demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -m ''

# Speed benchmarks: they print what they measured beside the baseline, in one run.
bench: $(STAMP)
	$(BIN)/python bench/attribution.py
	$(BIN)/python bench/verify.py

clean:
	rm -rf runs .pytest_cache
