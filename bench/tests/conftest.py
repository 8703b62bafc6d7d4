"""A throwaway Redis for the harness's tests (the tests of bench/ need nothing else)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from django_delayq.testing import RedisServer


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The server's URL, flushed, and named in BENCH_REDIS_URL as the harness reads it."""
    from bench.harness.marks import URL_ENV

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    monkeypatch.setenv(URL_ENV, redis_server.url)
    return redis_server.url
