# hierplan: `make demo` runs the data-migration demo offline; `make test` runs every check.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck pytest clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(DEV_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(STAMP)

## demo: migrate the sample database on the offline simulator (creates .venv if missing)
demo: $(STAMP)
	$(BIN)/hierplan demo

## test: ruff, mypy --strict on the package, and pytest (creates .venv if missing)
test: lint typecheck pytest

lint: $(DEV_STAMP)
	$(BIN)/ruff check hierplan tests $(wildcard benchmarks examples)
	$(BIN)/ruff format --check hierplan tests $(wildcard benchmarks examples)

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

pytest: $(DEV_STAMP)
	$(BIN)/pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
