"""Redis Sentinel: ``redis+sentinel://`` URLs, a django-redis Sentinel cache, and the
pinned connections of the fast enqueue path moving to a new primary after a failover.

Each test starts its own primary, replica and three sentinels (``redis-server
--sentinel``) on free ports: a failover changes the topology for good.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_delayq import Job, JobSpec, NotReplicated
from django_delayq.connection import get_broker
from django_delayq.engine.urls import client_from_url, parse_multi_host, redact
from tests.conftest import system_checks, wait_until, worker_thread
from tests.servers import RedisSentinelGroup
from tests.testapp import tasks

pytestmark = pytest.mark.slow


def start_group(**kwargs: Any) -> RedisSentinelGroup:
    try:
        return RedisSentinelGroup(**kwargs).start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"could not start a primary, a replica and three sentinels "
                    f"(redis-server --sentinel): {exc}")


@pytest.fixture
def sentinel_group() -> Iterator[RedisSentinelGroup]:
    group = start_group()
    yield group
    group.cleanup()


@pytest.fixture(scope="module")
def steady_group() -> Iterator[RedisSentinelGroup]:
    """A group shared by the tests that do not fail it over."""
    group = start_group()
    yield group
    group.cleanup()


def point_at(settings: Any, group: RedisSentinelGroup) -> RedisSentinelGroup:
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": group.url(db=2),
                       "FAILOVER_RETRY": 15.0}
    node(group.primary.port).flushdb()
    return group


@pytest.fixture
def on_sentinel(settings: Any, sentinel_group: RedisSentinelGroup) -> RedisSentinelGroup:
    """Settings on a group of this test's own (it may fail it over)."""
    return point_at(settings, sentinel_group)


@pytest.fixture
def on_steady(settings: Any, steady_group: RedisSentinelGroup) -> RedisSentinelGroup:
    return point_at(settings, steady_group)


def node(port: int, db: int = 2) -> Any:
    """A plain client of one server (db 2: the one ``on_sentinel`` points at)."""
    return redis.Redis(port=port, db=db, decode_responses=True)


def test_a_sentinel_url_names_sentinels_service_database_and_passwords():
    parsed = parse_multi_host(
        "rediss+sentinel://app:p%40ss@[::1]:26380,s2,s3:26381/my-service/4"
        "?sentinel_password=sp&ssl_cert_reqs=none")
    assert parsed.hosts == [("::1", 26380), ("s2", 26379), ("s3", 26381)]
    assert (parsed.service, parsed.db, parsed.username, parsed.password) == (
        "my-service", 4, "app", "p@ss")
    assert parsed.tls
    assert parsed.query["sentinel_password"] == "sp"
    shown = redact("rediss+sentinel://app:p%40ss@s1,s2/svc/0?sentinel_password=sp&x=1")
    assert shown == "rediss+sentinel://app:***@s1,s2/svc/0?sentinel_password=***&x=1"
    client = client_from_url("rediss+sentinel://:pw@s1:1,s2:2/svc/3?sentinel_password=sp",
                             decode_responses=True, socket_timeout=1.5)
    pool = client.connection_pool
    assert pool.service_name == "svc"
    assert "SSL" in pool.connection_class.__name__
    assert (pool.connection_kwargs["db"], pool.connection_kwargs["password"]) == (3, "pw")
    sentinels = pool.sentinel_manager.sentinels
    assert [s.connection_pool.connection_kwargs["port"] for s in sentinels] == [1, 2]
    kwargs = sentinels[0].connection_pool.connection_kwargs
    assert kwargs["password"] == "sp"
    assert kwargs["socket_timeout"] == 1.5
    assert "SSL" in sentinels[0].connection_pool.connection_class.__name__


@pytest.mark.parametrize("url", [
    "redis+sentinel://h1:26379,h2:26379",  # no service
    "redis+sentinel://h1:26379/svc/x",
    "redis+sentinel://:s3cret@h1:99999/svc/0",
    "redis+sentinel:///svc/0",
    "redis+cluster://h1:1,h2:2/3",  # a cluster has db 0 only
])
def test_bad_multi_host_urls_are_refused_without_the_password(url):
    with pytest.raises(ValueError) as info:
        parse_multi_host(url)
    assert "s3cret" not in str(info.value)


def test_every_process_enqueues_and_runs_through_the_sentinels(on_steady, broker):
    job = tasks.add.enqueue(2, 3)
    assert node(on_steady.primary.port).exists(f"{{dq:default}}:j:{job.id}")
    assert broker.client.connection_pool.connection_kwargs["db"] == 2
    with worker_thread(queues=["default"]):
        wait_until(lambda: job.refresh().status == "completed", message="the job to run")
    assert Job.fetch(job.id).result == 5


def test_pinned_connections_follow_a_failover_to_the_new_primary(on_sentinel, broker,
                                                                   caplog):
    """A graceful failover demotes the old primary (it answers READONLY), a SIGKILL
    drops its sockets: either way the next enqueue lands on the new primary, and the
    pinned connections of the fast path are connected to it afterwards. They are closed
    as soon as the sentinels announce the switch: the old primary takes writes until a
    sentinel demotes it, and drops them then."""
    tasks.record.enqueue("before")
    assert broker._pinned is not None
    assert broker._pinned._free, "the fast path pins a connection"
    old = on_sentinel.primary
    node(on_sentinel.sentinels[0].port, db=0).execute_command("SENTINEL FAILOVER", "mymaster")
    wait_until(lambda: "the sentinels switched the primary" in caplog.text, timeout=30,
               message="the client to hear of the switch")
    wait_until(lambda: not [c for c in broker._pinned._free if c.port == old.port],
               message="the pinned connections to the old primary closed")
    new = on_sentinel.wait_failover(old.port)
    # Until the sentinels turn the old primary into a replica, it takes writes that the
    # new one never sees (the MIN_REPLICAS test shows them refused): wait for READONLY.
    wait_until(lambda: node(old.port).info("replication")["role"] == "slave", timeout=30,
               message="the old primary to become a replica")
    jobs = [tasks.record.enqueue(f"after a graceful failover {i}") for i in range(3)]
    assert all(node(new.port).exists(f"{{dq:default}}:j:{job.id}") for job in jobs)
    pinned_ports = {conn.port for conn in broker._pinned._free}
    assert pinned_ports == {new.port}, "the demoted primary's connections are gone"
    # Now a crash: the new primary dies, the old one (now a replica) takes over again.
    new.kill()
    again = on_sentinel.wait_failover(new.port)
    assert again.port == old.port
    jobs = [tasks.record.enqueue(f"after a crash {i}") for i in range(3)]
    assert all(node(again.port).exists(f"{{dq:default}}:j:{job.id}") for job in jobs)
    assert {conn.port for conn in broker._pinned._free} == {again.port}


def test_min_replicas_waits_for_a_replica_and_says_when_none_confirmed(settings, on_steady):
    # A running replica confirms within a long deadline, however loaded the machine.
    settings.DELAYQ = {**settings.DELAYQ, "MIN_REPLICAS": 1, "MIN_REPLICAS_TIMEOUT": 10.0}
    replica = node(on_steady.replicas[0].port)
    job = tasks.add.enqueue(1, 1)
    # WAIT returned only once the replica had the job: it is there, no polling needed.
    assert replica.exists(f"{{dq:default}}:j:{job.id}")
    bulk = tasks.add.enqueue_many([JobSpec((i, i)) for i in range(50)])
    assert all(replica.exists(f"{{dq:default}}:j:{job_id}") for job_id in bulk.job_ids)
    # The replica stops acking for longer than the (now short) deadline.
    settings.DELAYQ = {**settings.DELAYQ, "MIN_REPLICAS_TIMEOUT": 0.2}
    replica.execute_command("CLIENT", "PAUSE", 2000, "ALL")
    try:
        with pytest.raises(NotReplicated) as info:
            tasks.add.using(job_id="unconfirmed").enqueue(2, 2)
        message = str(info.value)
        assert "unconfirmed" in message
        assert "0 of the 1 replica" in message
        assert "may or may not survive a failover" in message
        assert info.value.job_ids == ["unconfirmed"]
        with pytest.raises(NotReplicated) as bulk_info:
            tasks.add.enqueue_many([JobSpec((i, i)) for i in range(3)])
        assert len(bulk_info.value.job_ids) == 3
    finally:
        replica.execute_command("CLIENT", "UNPAUSE")
    # Written to the primary all the same: enqueuing it again is a dedupe.
    assert Job.fetch("unconfirmed").args == [2, 2]
    assert tasks.add.using(job_id="unconfirmed").enqueue(2, 2).id == "unconfirmed"


def test_min_replicas_acks_wait_for_the_replica_and_warn_when_it_falls_short(
        settings, on_steady, caplog):
    # A deadline a loaded machine meets while the replica runs, well within its pause.
    settings.DELAYQ = {**settings.DELAYQ, "MIN_REPLICAS": 1, "MIN_REPLICAS_TIMEOUT": 3.0,
                       "MIN_REPLICAS_ACKS": True}
    replica = node(on_steady.replicas[0].port)
    first = tasks.add.enqueue(1, 2)
    later = tasks.add.using(delay=1.5).enqueue(3, 4)  # acked while the replica is paused
    with worker_thread(queues=["default"]):
        wait_until(lambda: first.refresh().status == "completed", message="the first job")
        assert "acks confirmed by" not in caplog.text
        replica.execute_command("CLIENT", "PAUSE", 20_000, "ALL")  # unpaused below
        try:
            wait_until(lambda: any(getattr(r, "replicas", None) == 0 and r.min_replicas == 1
                                   for r in caplog.records), message="the acker's warning")
        finally:
            replica.execute_command("CLIENT", "UNPAUSE")
        # The ack is on the primary all the same: the job is done, nothing is resent. (The
        # warning may come from a round trip of start notes only, before the job's ack.)
        wait_until(lambda: later.refresh().status == "completed", message="the later job")
        assert later.refresh().result == 7


def test_cache_alias_uses_a_django_redis_sentinel_cache(settings, sentinel_group):
    # As django-redis documents its Sentinel support.
    settings.DJANGO_REDIS_CONNECTION_FACTORY = "django_redis.pool.SentinelConnectionFactory"
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "jobs": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": "redis://mymaster/5",
            "OPTIONS": {
                "CLIENT_CLASS": "django_redis.client.SentinelClient",
                "CONNECTION_POOL_CLASS": "redis.sentinel.SentinelConnectionPool",
                "SENTINELS": [("127.0.0.1", s.port) for s in sentinel_group.sentinels],
            },
        },
    }
    settings.DELAYQ = {"CACHE_ALIAS": "jobs", "FAILOVER_RETRY": 15.0}
    broker = get_broker()
    job = tasks.add.enqueue(4, 5)
    assert broker.client.connection_pool.service_name == "mymaster"
    primary = redis.Redis(port=sentinel_group.primary.port, db=5)
    assert primary.exists(f"{{dq:default}}:j:{job.id}")
    old = sentinel_group.primary
    old.kill()
    new = sentinel_group.wait_failover(old.port)
    again = tasks.add.enqueue(6, 7)
    assert redis.Redis(port=new.port, db=5).exists(f"{{dq:default}}:j:{again.id}")


def test_spark_executors_get_a_sentinel_url_for_a_django_redis_sentinel_cache(on_steady):
    from django_delayq.engine.urls import sentinel_url_from_cache

    sentinels = [("127.0.0.1", s.port) for s in on_steady.sentinels]
    url = sentinel_url_from_cache("redis://:pw@mymaster/2",
                                  {"SENTINELS": sentinels,
                                   "SENTINEL_KWARGS": {"password": "s&p"}})
    hosts = ",".join(f"127.0.0.1:{s.port}" for s in on_steady.sentinels)
    assert url == f"redis+sentinel://:pw@{hosts}/mymaster/2?sentinel_password=s%26p"
    assert sentinel_url_from_cache("redis://cache:6379/1", {}) is None
    # Without the passwords (the test sentinels and primary have none), it connects.
    client = client_from_url(f"redis+sentinel://{hosts}/mymaster/2", decode_responses=True)
    assert client.ping()
    assert client.connection_pool.get_master_address()[1] == on_steady.primary.port
    client.close()


def test_the_system_check_shows_what_is_wrong_and_never_the_password(settings):
    settings.DELAYQ = {"REDIS_URL": "redis+sentinel://:hunter2@h1:26379,h2:26379"}
    errors = [m for m in system_checks() if m.id == "django_delayq.E002"]
    assert len(errors) == 1
    assert "service name is missing" in errors[0].msg
    assert "hunter2" not in errors[0].msg
    assert "***" in errors[0].msg
    settings.DELAYQ = {"REDIS_URL": "redis+sentinel://:hunter2@h1,h2/mymaster/1"
                                    "?sentinel_password=hunter3"}
    assert not [m for m in system_checks() if m.id.startswith("django_delayq.")]
    settings.DELAYQ = {"REDIS_URL": "redis+cluster://h1:7000,h2:x/0"}
    assert [m.id for m in system_checks() if m.id.startswith("django_delayq.")] == [
        "django_delayq.E002"]
    assert os.environ.get("DELAYQ_TEST_REDIS_URL")
