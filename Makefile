# raylog: `make demo` runs the end-to-end demo, `make test` runs the test suite.
# Both create .venv with the pinned dependencies (constraints.txt) on first use.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt setup.py raylog/storage/_speedups.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[test,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m raylog.demo

test: $(STAMP)
	$(PY) -m pytest

bench: $(STAMP)
	$(PY) bench/storage.py
	$(PY) bench/throughput.py
	$(PY) bench/rebalance.py

clean:
	rm -rf $(VENV) build *.egg-info raylog/storage/_speedups*.so
