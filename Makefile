# The two commands of the README, and a few more. Each sets itself up: a virtualenv in
# .venv with every dependency, and a throwaway Redis when REDIS_URL is not given.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements-dev.txt | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# The suite runs on two xdist workers, each with its own Redis and database; the heavy
# tests stay together on one of them (tests/conftest.py). A given REDIS_URL is one server
# every test flushes: then the suite runs in one process.
XDIST ?= $(if $(REDIS_URL),,-n 2 --dist loadgroup)

.PHONY: demo serve test fuzz lint typecheck bench system-deps clean

$(STAMP): pyproject.toml requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q -e '.[api,tasks,cron,spark,django-redis,metrics]' -r requirements-dev.txt
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

## Chromium, Java, a Redis with TLS and PostgreSQL's binaries when apt can install them; never
## fails (what stays missing it names, with the tests that will fail for want of it).
system-deps: $(STAMP)
	./scripts/system-deps.sh $(BIN)/python

## Run the example project's main job: enqueue real tasks, run a worker, show what ran.
demo: $(STAMP)
	$(BIN)/python example_project/demo.py

## The demo, then its Redis, a worker and runserver left running (Ctrl-C stops them).
serve: $(STAMP)
	$(BIN)/python example_project/demo.py --serve

## Run the whole test suite against a throwaway Redis and PostgreSQL (and Chromium, Spark).
test: $(STAMP) system-deps
	$(BIN)/python -m pytest $(XDIST) $(PYTEST_ARGS)

## The property-based fuzz suite with its long profile (many more examples than make test).
fuzz: $(STAMP) system-deps
	HYPOTHESIS_PROFILE=fuzz $(BIN)/python -m pytest tests/fuzz $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	DELAYQ_TEST_REDIS_URL=redis://127.0.0.1:6379/0 $(BIN)/python -m django makemigrations --check --dry-run --settings tests.settings

typecheck: $(STAMP)
	$(BIN)/mypy

## Benchmarks against the peers (RQ, Celery, Dramatiq, Huey, arq, SAQ) on one Redis.
bench: $(STAMP)
	./bench/run.sh
	$(BIN)/python bench/shards.py

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
