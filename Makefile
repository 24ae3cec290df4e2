# The two commands of the README. Each does the whole set-up on a fresh machine first:
#   make demo   - the agent doing its real job against a local control plane
#   make test   - lint, types, and the full test suite (unit + end-to-end against real components)
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: setup setup-node demo test lint unit e2e bench bench-download clean image

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)
	$(BIN)/python -m testbed build --with-helm --with-emulators --with-olah

# The real node's binaries (kubelet, controller manager, scheduler) and the agent image, for the tests
# only (tests/e2e/test_real_node.py, tests/unit/test_image_contents.py); cached like the control plane.
setup-node: $(STAMP)
	$(BIN)/python -m testbed build --with-node

# The agent image from Dockerfile, on a base bootstrapped from the apt mirror (no registry needed);
# prints the cached OCI archive and its name (import: ctr -n k8s.io images import <archive>).
image: $(STAMP)
	$(BIN)/python -m testbed image

demo: setup
	$(BIN)/python -m testbed demo

lint: $(STAMP)
	$(BIN)/ruff check src testbed tests bench
	$(BIN)/ruff format --check src testbed tests bench
	$(BIN)/mypy
# The package layers and "the product never imports the test bed" ([tool.importlinter] in pyproject.toml).
	$(BIN)/lint-imports
# Docstring coverage of public definitions, at least 80 % ([tool.interrogate] in pyproject.toml).
	$(BIN)/interrogate src/model_agent testbed

unit: $(STAMP)
	$(BIN)/pytest tests/unit -q

test: setup setup-node lint
	$(BIN)/pytest -q

# The download benchmark against peers (python -m bench.download, 3 rounds, ~45 min): writes bench/REPORT.md and
# bench/results/download.jsonl. Installs its Debian tools when run as root.
bench-download: $(STAMP)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench.download run

clean:
	rm -rf $(VENV) .venv-olah .pytest_cache .mypy_cache .ruff_cache
