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

.PHONY: setup tools-setup protos protos-check lint test test-fast run model tiny-model bench bench-quick cluster clean

## setup: the serving virtualenv with the runtime and dev tools (idempotent)
setup: $(VENV)/.stamp
$(VENV)/.stamp: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	@touch $@

## tools-setup: the model-conversion virtualenv (torch, transformers, the genai builder)
tools-setup: $(TOOLS_VENV)/.stamp
$(TOOLS_VENV)/.stamp: model_tools/requirements.txt model_tools/requirements-nodeps.txt
	@test -x $(TOOLS_VENV)/bin/python || $(PYTHON) -m venv $(TOOLS_VENV)
	$(TOOLS_VENV)/bin/pip install -q --upgrade pip
	$(TOOLS_VENV)/bin/pip install -q -r model_tools/requirements.txt
	$(TOOLS_VENV)/bin/pip install -q --no-deps -r model_tools/requirements-nodeps.txt
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

lint: setup
	$(BIN)/ruff check .

## model: the default model (SmolLM2-135M-Instruct, fp32 and int4) in $(ORTSERVE_MODEL_CACHE)
model: tools-setup
	$(TOOLS_VENV)/bin/python -m model_tools.prepare >/dev/null

tiny-model: tools-setup
	$(TOOLS_VENV)/bin/python -m model_tools.prepare --only tiny >/dev/null

## test: every test, the slow ones on the real model included
test: setup model tiny-model
	$(BIN)/pytest -q

## test-fast: unit and service tests only
test-fast: setup tiny-model
	$(BIN)/pytest -q -m "not slow" tests/unit tests/service

## run: serve the default model locally (scheduler + one CPU worker), a demo answer, then keep serving
## (stdout: the answer only; the runner's notices go to stderr)
run: setup model
	@$(BIN)/python -m devtools.cluster --workers 1 --demo

## cluster: the compose topology as local processes, WORKERS=N
cluster: setup model
	@$(BIN)/python -m devtools.cluster --workers $(WORKERS)

bench: setup tools-setup model
	$(BIN)/python -m bench.run

bench-quick: setup tools-setup tiny-model model
	$(BIN)/python -m bench.run --quick

clean:
	rm -rf $(VENV) $(TOOLS_VENV) .pytest_cache .ruff_cache .hypothesis
