"""Connections: REDIS_URL, a django-redis cache alias, and clear errors when Redis is away."""

from __future__ import annotations

import os

import pytest

from django_delayq import DelayQConnectionError, Job
from django_delayq.connection import get_broker
from django_delayq.testing import free_port
from tests.testapp import tasks


def test_cache_alias_reuses_a_django_redis_connection(settings):
    url = os.environ["DELAYQ_TEST_REDIS_URL"].rsplit("/", 1)[0] + "/3"
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "jobs": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": url},
    }
    settings.DELAYQ = {"CACHE_ALIAS": "jobs"}
    broker = get_broker()
    broker.client.flushdb()
    job = tasks.add.enqueue(1, 2)
    assert broker.client.connection_pool.connection_kwargs["db"] == 3
    assert Job.fetch(job.id).args == [1, 2]
    assert broker.client.exists(f"{{dq:default}}:j:{job.id}")
    broker.client.flushdb()


def test_unreachable_redis_raises_a_clear_error_without_the_password(settings):
    port = free_port()
    settings.DELAYQ = {"REDIS_URL": f"redis://:hunter2@127.0.0.1:{port}/0",
                       "SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5}
    with pytest.raises(DelayQConnectionError) as info:
        tasks.add.enqueue(1, 2)
    message = str(info.value)
    assert f"redis://127.0.0.1:{port}/0 is unreachable" in message
    assert "hunter2" not in message
