# The two commands of the README: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test lint typecheck unit clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## Start the local platform with the example cluster, run example jobs, keep running until Ctrl-C.
demo: $(STAMP)
	$(BIN)/fairgang dev --config examples/cluster.yaml --data-dir .fairgang --demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

## ruff, mypy, then the whole suite (SQLite, and PostgreSQL where DATABASE_URL or 127.0.0.1:5432 answers).
test: lint typecheck
	$(BIN)/pytest -q --durations=15 -n 3 --dist loadfile

clean:
	rm -rf $(VENV) .fairgang .pytest_cache .mypy_cache .ruff_cache
