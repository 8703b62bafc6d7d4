"""pytest fixtures for projects that use django-delayq: a throwaway Redis and ``run_jobs``.

Loaded automatically when django-delayq is installed (a ``pytest11`` entry point; turn
it off with ``-p no:django_delayq``). See docs/testing.md.

- ``delayq_redis``: ``DELAYQ["REDIS_URL"]`` points at an empty Redis database for the
  test (eager mode off), and its URL is returned. The Redis is ``DELAYQ_TEST_REDIS_URL``
  when set, else a ``redis-server`` of the plugin's own, started on first use.
- ``run_jobs``: ``run_jobs(queues=None)`` runs every job that is due with a real worker
  in burst mode, in this process, and returns how many ran.
- A guard: a test that asks for neither keeps off the Redis of the settings (which may
  be a developer's own): its first Redis command through django-delayq fails the test,
  naming the fixture to add. Eager mode sends none. Settings that point
  ``DELAYQ`` at ``DELAYQ_TEST_REDIS_URL`` (a Redis given to the tests to empty, as this
  project's own suite does) are left alone.

The plugin is loaded by every pytest run where django-delayq is installed, before Django
is set up: django-delayq's Django layer and worker are imported inside the fixtures, when
a test first needs them, not when pytest starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from django.conf import settings as django_settings

from .. import connection
from ..conf import conf
from ..engine.queue import flush_database
from ..engine.urls import CLUSTER_SCHEMES, redact, refuse_connections
from ..testing import RedisServer
from ..worker import Worker

#: The Redis the tests may empty, when the developer names one.
TEST_REDIS_ENV = "DELAYQ_TEST_REDIS_URL"


@pytest.fixture(scope="session")
def delayq_redis_url() -> Iterator[str]:
    """A Redis for the test session: ``DELAYQ_TEST_REDIS_URL``, or a redis-server of its
    own on a free port, stopped at the end."""
    url = os.environ.get(TEST_REDIS_ENV)
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
    current = dict(getattr(settings, "DELAYQ", None) or {})
    settings.DELAYQ = {**current, "REDIS_URL": delayq_redis_url, "EAGER": False,
                       "CACHE_ALIAS": None}
    connection.reset()
    flush_database(connection.get_broker())
    try:
        yield delayq_redis_url
    finally:
        connection.reset()


@pytest.fixture
def run_jobs(delayq_redis: str) -> Callable[..., int]:
    """``run_jobs(queues=None, *, concurrency=1)``: run the due jobs, return how many ran
    (whatever their outcome: a job that failed ran too)."""
    def run(queues: Sequence[str] | None = None, *, concurrency: int = 1) -> int:
        worker = Worker(queues=queues, burst=True, concurrency=concurrency,
                        name="pytest-run-jobs", block_timeout=0.1)
        worker.run()
        return int(worker.jobs_finished)

    return run


@pytest.fixture(autouse=True)
def _delayq_keep_off_the_settings_redis(request: pytest.FixtureRequest,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail a test that uses Redis through django-delayq without ``delayq_redis``.

    Every client of django-delayq is made by ``connection.make_client``: during such a
    test the clients it makes for any Redis but the one the tests may empty
    (``DELAYQ_TEST_REDIS_URL``, or ``delayq_redis_url`` when the test asked for it) fail
    the test as their first connection starts, before its socket opens (eager mode makes
    a client for its checks and sends nothing). Nothing is replaced when the test asked for
    ``delayq_redis``, when Django is not set up (no settings, no Redis), or when the
    settings already point at the Redis the tests may empty.
    """
    if "delayq_redis" in request.fixturenames or not django_settings.configured:
        return
    disposable = {os.environ.get(TEST_REDIS_ENV) or None}
    if "delayq_redis_url" in request.fixturenames:
        disposable.add(request.getfixturevalue("delayq_redis_url"))

    def points_at_disposable() -> bool:
        return conf.REDIS_URL in disposable and not conf.CACHE_ALIAS

    if points_at_disposable():
        return
    make_client = connection.make_client
    test = request.node.nodeid

    def refuse() -> Any:
        __tracebackhide__ = True  # the test's own call is the line to show
        where = (f"the cache {conf.CACHE_ALIAS!r}" if conf.CACHE_ALIAS
                 else redact(conf.REDIS_URL))
        pytest.fail(
            f"{test} used django-delayq's Redis ({where}) without asking for one: add "
            "the delayq_redis fixture (a throwaway Redis, emptied for the test; run_jobs "
            "uses it too), or set DELAYQ['EAGER'] for a test that needs no Redis. The "
            "django_delayq pytest plugin keeps tests off the Redis of the settings, which "
            f"may be your own; name a Redis the tests may empty in {TEST_REDIS_ENV} "
            "(docs/testing.md).")

    def make_guarded_client(socket_timeout: float | None = None) -> Any:
        if points_at_disposable():
            return make_client(socket_timeout)
        if not conf.CACHE_ALIAS and conf.REDIS_URL.startswith(CLUSTER_SCHEMES):
            refuse()  # a Cluster client connects to its nodes as it is made
        return refuse_connections(make_client(socket_timeout), refuse)

    connection.reset()  # a client made before the test would slip past the guard
    monkeypatch.setattr(connection, "make_client", make_guarded_client)
