# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create ./.venv (Python >= 3.10) and install the pinned set from requirements-lock.txt.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
STAMP  := $(VENV)/.installed
CORES  ?= 2
DEMO_CONFIG := workflow/demo/config.yaml
SMK    := PATH="$(BIN):$$PATH" $(BIN)/snakemake

.PHONY: install demo test lint figures clean-demo

$(STAMP): pyproject.toml requirements-lock.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -c requirements-lock.txt torch torchvision
	$(BIN)/pip install -q -c requirements-lock.txt -e ".[slurm,test]"
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(SMK) --cores $(CORES) --configfile $(DEMO_CONFIG) --workflow-profile workflow/profiles/default
	@PATH="$(BIN):$$PATH" ladbench where --configfile $(DEMO_CONFIG)

test: install
	PATH="$(BIN):$$PATH" $(BIN)/pytest

lint: install
	$(SMK) --lint --configfile $(DEMO_CONFIG)

figures: install
	$(SMK) --cores $(CORES) --configfile $(DEMO_CONFIG) --workflow-profile workflow/profiles/default report_all

clean-demo:
	rm -rf results/demo
