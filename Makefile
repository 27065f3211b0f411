# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create ./.venv (Python >= 3.10) and install the paper lane's pinned set from
# requirements-lock.txt (transformers 4.53, the published numbers). The current lane
# (transformers 5.x, today's models) lives beside it: `make install-current` creates
# ./.venv-current from requirements-current.txt, `make test-current` runs the model-facing
# tests (pytest marker `lanes`) on it.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
CORES  ?= 2
# the suite runs on CORES workers, whole test files each (pytest-xdist; conftest.py orders them)
PYTEST_WORKERS ?= -n $(CORES) --dist loadfile
# the slowest tests, setup and body apart: what pyproject's per-test `timeout` must stay above
PYTEST_REPORT ?= --durations=15
DEMO_CONFIG := workflow/demo/config.yaml
SMK    := PATH="$(BIN):$$PATH" $(BIN)/snakemake

CURRENT_VENV := .venv-current
CURRENT_BIN  := $(abspath $(CURRENT_VENV))/bin
CURRENT_STAMP := $(CURRENT_VENV)/.installed

.PHONY: install demo test lint figures clean-demo install-current test-current gpu-wheels

$(STAMP): pyproject.toml requirements-lock.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c requirements-lock.txt torch torchvision
	$(BIN)/pip install -q -c requirements-lock.txt -e ".[slurm,test]"
	touch $(STAMP)

install: $(STAMP)

$(CURRENT_STAMP): pyproject.toml requirements-current.txt
	$(PYTHON) -m venv $(CURRENT_VENV)
	$(CURRENT_BIN)/pip install -q -c requirements-current.txt torch torchvision
	$(CURRENT_BIN)/pip install -q -c requirements-current.txt -e ".[test,current]"
	touch $(CURRENT_STAMP)

install-current: $(CURRENT_STAMP)

demo: install
	$(SMK) --cores $(CORES) --configfile $(DEMO_CONFIG) --workflow-profile workflow/profiles/default
	@PATH="$(BIN):$$PATH" ladbench where --configfile $(DEMO_CONFIG)

test: install
	PATH="$(BIN):$$PATH" $(BIN)/pytest $(PYTEST_WORKERS) $(PYTEST_REPORT)

test-current: install-current
	PATH="$(CURRENT_BIN):$$PATH" $(CURRENT_BIN)/pytest $(PYTEST_WORKERS) $(PYTEST_REPORT) -m "lanes and not slurm"

# The workflow's own checks and its layout (snakefmt: [tool.snakefmt]), then ruff over the
# Python (rules: [tool.ruff] in pyproject.toml).
lint: install
	$(SMK) --lint --configfile $(DEMO_CONFIG)
	$(BIN)/snakefmt --check Snakefile workflow/
	$(BIN)/ruff check .

figures: install
	$(SMK) --cores $(CORES) --configfile $(DEMO_CONFIG) --workflow-profile workflow/profiles/default report_all

clean-demo:
	rm -rf results/demo

# Wheels a lent GPU machine's python lacks (benchmarks/gpu_wheels.txt), for its Python 3.12 on
# x86-64, into .whl/ (git-ignored); benchmarks/gpu_session.sh installs them there.
GPU_WHEEL_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 any
gpu-wheels:
	mkdir -p .whl
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  $(addprefix --platform ,$(GPU_WHEEL_PLATFORMS)) -d .whl -r benchmarks/gpu_wheels.txt
