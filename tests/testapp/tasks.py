"""Tasks the tests enqueue. They report to Redis, so tests in another process see them."""

from __future__ import annotations

import json
import os
import time

from django_delayq import task
from django_delayq.connection import get_broker

RAN = "test:ran"


def _client():
    return get_broker().client


def _note(name: str, **data: object) -> None:
    seconds, micros = _client().time()
    data.update(task=name, pid=os.getpid(), redis_ms=int(seconds) * 1000 + int(micros) // 1000)
    _client().rpush(RAN, json.dumps(data))


@task
def record(tag: str, *, extra: object = None) -> str:
    """Note that it ran, and return its tag."""
    _note("record", tag=tag, extra=extra)
    return tag


@task(queue="other")
def record_other(tag: str) -> str:
    _note("record_other", tag=tag)
    return tag


@task(max_attempts=3, retry_backoff=0.2, retry_backoff_max=1.0)
def always_fails(tag: str) -> None:
    _note("always_fails", tag=tag)
    raise RuntimeError(f"boom {tag}")


@task(max_attempts=1)
def returns_unjsonable() -> object:
    return object()


@task(max_attempts=2)
def gated(tag: str, gate: str) -> str:
    """Note that it started, then wait (at most 60 s) until the key ``gate`` exists."""
    _note("gated-start", tag=tag)
    deadline = time.monotonic() + 60
    while not _client().exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        time.sleep(0.02)
    _note("gated-end", tag=tag)
    return tag


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def count_run(tag: str) -> None:
    """Count a run in the hash ``test:count`` (a field per tag)."""
    _client().hincrby("test:count", tag, 1)


if os.environ.get("DELAYQ_TEST_PERIODIC"):
    # Only in the worker processes of the periodic-task tests: every other worker would
    # otherwise schedule it too.
    @task(name="tests.periodic_tick", queue="periodic",
          every=float(os.environ["DELAYQ_TEST_PERIODIC"]))
    def periodic_tick() -> None:
        _note("periodic_tick")


# Tasks written against Django's Tasks API, found by workers through this module, and the
# tasks of the fault and bad-input tests.
from . import fault_tasks, standard_tasks  # noqa: E402, F401


@task
def connection_health_checked() -> bool:
    """Whether Django's default connection counts as health-checked when the job starts."""
    from django.db import connection

    return connection.health_check_done
