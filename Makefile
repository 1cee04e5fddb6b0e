# The README's two commands: `make demo` and `make test`. Each creates .venv when missing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# GPU users: make TORCH_SPEC="torch==2.13.0 --index-url ..." test
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo test test-slow bench lint clean

$(BIN)/phasekv: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/phasekv

setup: $(BIN)/phasekv

demo: setup
	$(BIN)/phasekv demo --out demo_out $(DEMO_ARGS)

test: setup
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

bench: setup
	$(BIN)/python benchmarks/run_all.py

lint: setup
	$(BIN)/ruff check phasekv tests benchmarks
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) build *.egg-info
