# Set-up is part of every target: a fresh machine needs only `make demo` or `make test`.
# TORCH picks the torch release (2.13.0: the CPU build; 2.14.1: the CUDA build, which runs on the CPU), each in a
# venv of its own: `make test TORCH=2.14.1` runs the suite against the other one.
TORCH ?= 2.13.0
VENV ?= $(if $(filter 2.13.0,$(TORCH)),.venv,.venv-torch$(TORCH))
PY := $(VENV)/bin/python

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==$(TORCH)
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

.PHONY: demo test test-fast test-all-torch lint bench bench-real browser
# The demo also records its run (DEALIAS_REPORT) and prints where the HTML report is.
REPORT ?= build/report
demo: $(VENV)/.installed
	DEALIAS_REPORT=$(REPORT) $(VENV)/bin/dealias demo

# The report's browser test (tests/test_report.py) drives Debian's headless Chromium: installed when missing. An
# install that fails (no root, no registry) is not an error: that test then skips and says why.
browser:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || \
		apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1) || \
		echo "chromium could not be installed: the report's browser test will skip"

test: $(VENV)/.installed browser
	$(PY) -m pytest -q

# The inner loop: no inductor compiles, no distributed processes, nothing marked slow (tests/conftest.py).
test-fast: $(VENV)/.installed browser
	$(PY) -m pytest -q -m "not slow and not inductor and not distributed"

# What CI runs: the suite on both supported torch releases.
test-all-torch:
	$(MAKE) test TORCH=2.13.0
	$(MAKE) test TORCH=2.14.1

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

bench: $(VENV)/.installed
	$(PY) bench/run.py

# The real workloads (torch.optim, resnet18, GPT-2, MHA, decode steps...): per call and first call, ~25 minutes.
bench-real: $(VENV)/.installed
	$(PY) bench/real.py --json build/bench-real.json
