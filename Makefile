# Set-up is part of every target: a fresh machine needs only `make demo` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

.PHONY: demo test lint bench
demo: $(VENV)/.installed
	$(VENV)/bin/dealias demo

test: $(VENV)/.installed
	$(PY) -m pytest -q

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

bench: $(VENV)/.installed
	$(PY) bench/run.py
