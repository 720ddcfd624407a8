# The two commands of the README: `make demo` and `make test`.
# Each creates .venv on first use and installs the project into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test check bench-quick clean-venv

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "robustmq needs Python >= 3.11; set PYTHON=python3.11")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/robustmq demo

test: $(STAMP)
	$(PY) scripts/check

bench-quick: $(STAMP)
	$(PY) benchmarks/bench_storage.py --quick

clean-venv:
	rm -rf $(VENV)
