# Two commands do all set-up on a fresh machine (Python >= 3.11 with venv):
#   make demo   - venv, install, then a real agent + embedded nats-server on a simulated GPU node
#   make test   - venv, install, lint, type-check and the whole test suite
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_DURATION ?= 30

.PHONY: demo test lint test-slow bench clean

$(BIN)/.installed: pyproject.toml
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python >= 3.11 is required")'
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $@

demo: $(BIN)/.installed
	$(BIN)/gpu-node-agent demo --duration $(DEMO_DURATION)

lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lint-imports

test: lint
	$(BIN)/python -m pytest

test-slow: $(BIN)/.installed
	$(BIN)/python -m pytest -m slow

bench: $(BIN)/.installed
	$(BIN)/python bench/spool_drain.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache .hypothesis
