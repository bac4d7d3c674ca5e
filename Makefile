# Set-up is automatic: every target bootstraps .venv on first use.
# ACCEL=cpu (default, what CI runs) | cuda12 (NVIDIA GPUs) | tpu (Cloud TPU VMs): docs/install.md.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
CONFIG ?= configs/ibpo_gspo.py
WORKDIR ?= workdirs/ibpo_gspo
PYTEST_ARGS ?=
ACCEL ?= cpu

ifeq ($(filter $(ACCEL),cpu cuda12 tpu),)
$(error ACCEL=$(ACCEL): expected cpu, cuda12 or tpu)
endif
# One stamp per accelerator: switching ACCEL installs its extra into the same venv.
comma := ,
STAMP := $(BIN)/.installed$(if $(filter-out cpu,$(ACCEL)),-$(ACCEL))
EXTRAS := dev$(if $(filter-out cpu,$(ACCEL)),$(comma)$(ACCEL))
# Where the parity tests' CPU torch comes from on an accelerator host (PyPI's Linux torch is a
# CUDA build); the CPU default keeps the plain index, which CI's machines serve as CPU wheels.
TORCH_INDEX ?= $(if $(filter-out cpu,$(ACCEL)),https://download.pytorch.org/whl/cpu)

.PHONY: install train test bench lint clean

install: $(STAMP)

$(STAMP): setup.py
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch (parity tests only); installed first so no CUDA build is ever pulled, also
	# with ACCEL=cuda12 (jax brings its own CUDA libraries; torch is no runtime dependency).
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	touch $@

train: $(STAMP)
	$(BIN)/python -m ibpo_jax.train --config=$(CONFIG) --workdir=$(WORKDIR)

test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadfile $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m experiments.benchmarks.bench_lcs
	$(BIN)/python -m experiments.benchmarks.bench_model
	$(BIN)/python experiments/benchmarks/bench_rl_step.py

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
