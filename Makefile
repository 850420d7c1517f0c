# hierplan: `make demo` runs the data-migration demo offline; `make test` runs every check;
# `make bench` runs the performance benchmarks; `make docs` serves the documentation site.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck docs-build docs pytest e2e bench clean

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

## test: ruff, the import contracts (lint-imports), mypy --strict (package, tests, benchmarks,
## examples, docs), a strict build of the documentation site, and pytest (creates .venv if missing)
test: lint typecheck docs-build pytest

# ruff format also checks the Python code blocks of the Markdown files (README.md, docs/*.md).
lint: $(DEV_STAMP)
	$(BIN)/ruff check hierplan tests $(wildcard benchmarks examples) docs
	$(BIN)/lint-imports
	$(BIN)/ruff format --check hierplan tests $(wildcard benchmarks examples) README.md docs

typecheck: $(DEV_STAMP)
	$(BIN)/mypy

# Material for MkDocs prints a notice about its successor on every build unless told not to.
MKDOCS := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs

## docs-build: build the documentation site into site/; any warning (a broken link or anchor, an
## API name mkdocstrings cannot render) fails the build
docs-build: $(DEV_STAMP)
	$(MKDOCS) build --strict --site-dir site

## docs: serve the documentation site at http://127.0.0.1:8000, rebuilt on every change
docs: $(DEV_STAMP)
	$(MKDOCS) serve

pytest: $(DEV_STAMP)
	$(BIN)/pytest -q -n auto

E2E_STAMP := $(VENV)/.installed-e2e
PHOENIX_VENV := .venv-phoenix

$(E2E_STAMP): pyproject.toml $(DEV_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,e2e]'
	touch $@

# Phoenix pins anthropic<2 (hierplan needs 2.x), so the phoenix extra's packages go into a
# virtualenv of their own, without hierplan; the tests start `phoenix serve` from there.
PHOENIX_EXTRA = import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["phoenix"])
$(PHOENIX_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PHOENIX_VENV)
	$(PHOENIX_VENV)/bin/python -m pip install --quiet $$($(PHOENIX_VENV)/bin/python -c '$(PHOENIX_EXTRA)')
	touch $@

## e2e: the HTML report in Chromium (/usr/bin/chromium: apt-get install chromium) and the
## demo's trace in Arize Phoenix; installs playwright and Phoenix, never a browser download
e2e: $(E2E_STAMP) $(PHOENIX_VENV)/.installed
	HIERPLAN_PHOENIX=$(PHOENIX_VENV)/bin/phoenix $(BIN)/pytest -q -m e2e

BENCH_STAMP := $(VENV)/.installed-bench

$(BENCH_STAMP): pyproject.toml $(DEV_STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	touch $@

## bench: the performance benchmarks (overhead against anyio and LangGraph, in time and, with
## valgrind, in instructions; makespan, 100,000 leaves, tracing cost, start-up time); writes
## benchmarks/results/*.json and the tables of benchmarks/README.md
bench: $(BENCH_STAMP)
	$(BIN)/python benchmarks/overhead.py
	@if command -v valgrind >/dev/null; then $(BIN)/python benchmarks/instructions.py; \
	else echo "benchmarks/instructions.py not run: valgrind is not installed (apt-get install valgrind)"; fi
	$(BIN)/python benchmarks/memory.py
	$(BIN)/python benchmarks/makespan.py
	$(BIN)/python benchmarks/scale.py
	$(BIN)/python benchmarks/tracing.py
	$(BIN)/python benchmarks/startup.py
	$(BIN)/python benchmarks/report.py

clean:
	rm -rf $(VENV) $(PHOENIX_VENV) runs site .pytest_cache .mypy_cache .ruff_cache
