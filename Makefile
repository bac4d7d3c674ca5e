# Set-up is automatic: every target bootstraps .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= configs/ibpo_gspo.py
WORKDIR ?= workdirs/ibpo_gspo
PYTEST_ARGS ?=

.PHONY: train test bench lint clean

$(BIN)/.installed: setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch (parity tests only); installed first so no CUDA build is ever pulled.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

train: $(BIN)/.installed
	$(BIN)/python -m ibpo_jax.train --config=$(CONFIG) --workdir=$(WORKDIR)

test: $(BIN)/.installed
	$(BIN)/python -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

bench: $(BIN)/.installed
	$(BIN)/python experiments/benchmarks/bench_lcs.py
	$(BIN)/python experiments/benchmarks/bench_model.py
	$(BIN)/python experiments/benchmarks/bench_rl_step.py

lint: $(BIN)/.installed
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
