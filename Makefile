# The two set-up commands of the README: `make demo` (the main job) and `make test`.
# Both create .venv on first use; nothing else needs to be installed by hand.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

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

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache test-artifacts
