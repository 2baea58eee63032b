# Two commands for a new machine: `make demo` and `make test`.
VENV := .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)
# Test files run in parallel; tests on the shared Slurm cluster share one worker, and the chaos
# scenarios run beside them on a cluster of their own (scripts/run-tests).
export TEST_WORKERS ?= 4

.PHONY: demo test install services lint bench clean

$(BIN)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/klique demo

services:
	scripts/apt-deps
	scripts/services-up

test: install services
	KLIQUE_REQUIRE_SERVICES=1 scripts/run-tests
	$(MAKE) lint

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet  # the docs site, into site/ (mkdocs.yml)

bench: install services
	$(BIN)/python bench/latency_host.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache site
