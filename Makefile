# The two set-up commands of the README: `make demo` (the main job) and `make test`;
# `make dist` builds the wheel of the README's Install.
# Both create .venv on first use; nothing else needs to be installed by hand.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench dist clean

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $@

demo: $(VENV)/.installed
	$(BIN)/gradwatch demo

test: $(VENV)/.installed
	bash scripts/test.sh $(VENV)

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	bash scripts/mypy.sh $(VENV)

bench: $(VENV)/.installed
	$(BIN)/python bench/probe_overhead.py
	$(BIN)/python bench/server_ingest.py
	$(BIN)/python bench/dashboard.py
	$(BIN)/python bench/startup.py
	$(BIN)/python bench/peers.py
	$(BIN)/python bench/storage.py
	$(BIN)/python bench/storage_server.py

# The README's Install: an sdist and a wheel in dist/, to install on another machine. A
# small venv of its own holds `build`, so this needs neither .venv nor torch.
DIST_VENV ?= .venv-dist
PYTHON ?= python3

dist:
	test -x $(DIST_VENV)/bin/python || $(PYTHON) -m venv $(DIST_VENV)
	$(DIST_VENV)/bin/python -m pip install -q --disable-pip-version-check 'build>=1'
	rm -f dist/gradwatch-*
	$(DIST_VENV)/bin/python -m build --outdir dist .

clean:
	rm -rf $(VENV) $(DIST_VENV) dist .pytest_cache .mypy_cache .ruff_cache test-artifacts
