# The two commands of the README, and a few more. Each sets itself up: a virtualenv in
# .venv with every dependency, and a throwaway Redis when REDIS_URL is not given.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# What the virtualenv is made from: a change to any of them reinstalls it.
DEPS := pyproject.toml requirements-dev.txt constraints.txt
STAMP := $(VENV)/.installed-$(shell cat $(DEPS) | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# The suite runs on two xdist workers, each with its own Redis and database; the heavy
# tests stay together on one of them (tests/conftest.py). A third worker was measured:
# the CPU-bound tests (Spark, the browser) took up to twice as long, the whole no less.
# A given REDIS_URL is one server every test flushes: then the suite runs in one process.
XDIST ?= $(if $(REDIS_URL),,-n 2 --dist loadgroup)

.PHONY: demo serve test fuzz tox lint typecheck bench bench-quick system-deps clean

$(STAMP): $(DEPS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q -e '.[api,tasks,cron,spark,django-redis,metrics,otel]' -r requirements-dev.txt
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

## tox.ini's environments (TOX_ARGS, e.g. TOX_ARGS='-e redis5,redis6,redis7,redislatest';
## none: all of them). tox looks for each environment's Python on PATH: pyenv's installed
## versions go on it first, as pyenv's shims only answer for the versions it has active.
PYENV_BINS := $(wildcard $(or $(PYENV_ROOT),$(HOME)/.pyenv)/versions/3.1[0-9]*/bin)
empty :=
TOX_PATH := $(subst $(empty) $(empty),:,$(strip $(PYENV_BINS) $(PATH)))
TOX_ARGS ?=
tox: $(STAMP) system-deps
	PATH="$(TOX_PATH)" $(BIN)/tox $(TOX_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	DELAYQ_TEST_REDIS_URL=redis://127.0.0.1:6379/0 $(BIN)/python -m django makemigrations --check --dry-run --settings tests.settings

typecheck: $(STAMP)
	$(BIN)/mypy

# Every benchmark script reads these (bench/README.md): sizes times BENCH_SCALE, the peers'
# table the median of BENCH_RUNS runs, every results file written to BENCH_OUT.
BENCH_SCALE ?= 1
BENCH_RUNS ?= 3
BENCH_OUT ?= bench/results
BENCH_ENV = BENCH_SCALE=$(BENCH_SCALE) BENCH_RUNS=$(BENCH_RUNS) BENCH_OUT=$(BENCH_OUT)

## Every benchmark row, each writing its results file, then latest.md with all their tables:
## the peers (RQ, Celery, Dramatiq, Huey, arq, SAQ) on one Redis with django-delayq's own
## worker configurations and replicas, shards, workflows, outbox, bulk enqueue, Spark, lake.
## About an hour on 2 quiet cores: run nothing else meanwhile.
bench: $(STAMP) system-deps
	$(BENCH_ENV) ./bench/run.sh
	$(BENCH_ENV) $(BIN)/python -m bench.shards
	$(BENCH_ENV) $(BIN)/python -m bench.workflows --celery bench/.venv-peers/bin/python
	$(BENCH_ENV) $(BIN)/python -m bench.outbox
	$(BENCH_ENV) $(BIN)/python -m bench.bulk_enqueue
	$(BENCH_ENV) $(BIN)/python -m bench.keyed
	$(BENCH_ENV) $(BIN)/python -m bench.spark_bulk
	$(BENCH_ENV) $(BIN)/python -m bench.lake
	$(BENCH_ENV) $(BIN)/python -m bench.mirror
	$(BENCH_ENV) $(BIN)/python -m bench.scrape

	$(BENCH_ENV) $(BIN)/python -m bench.sizing
	$(BIN)/python -m bench.report $(BENCH_OUT)

## The same end to end at a small scale, into bench/results/quick: checks that every row
## runs and writes its file (its figures mean little).
bench-quick:
	$(MAKE) bench BENCH_SCALE=0.02 BENCH_RUNS=1 BENCH_OUT=bench/results/quick

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache
