"""django-delayq on a real local Redis Cluster (3 primaries): sharded queues, workers in
several processes, limits and pause across shards in different slots."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from django_delayq import Call, Job, Queue
from django_delayq.engine import Broker
from django_delayq.testing import RedisCluster
from tests.conftest import ran, wait_until, worker_thread
from tests.test_flow_control import most_in_any_window, start_workers, stop_workers
from tests.testapp import tasks

pytestmark = pytest.mark.slow

QUEUES = {
    "sharded": {"shards": 4},
    "drain": {"shards": 4},
    "metered": {"shards": 4, "rate_limit": "20/s"},
    "spaced": {"interval": 0.2, "shards": 3},
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    try:
        server = RedisCluster().start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"could not start a local Redis Cluster of 3 redis-server processes: "
                    f"{exc}")
    yield server
    server.cleanup()


@pytest.fixture
def on_cluster(settings: Any, cluster: RedisCluster) -> Broker:
    """Settings pointing at the cluster, emptied first; returns the broker."""
    from django_delayq.connection import get_broker

    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": cluster.url, "QUEUES": QUEUES}
    broker = get_broker()
    assert broker.is_cluster
    broker.client.flushall()
    return broker


def test_every_queue_operation_works_on_a_sharded_queue(on_cluster):
    broker = on_cluster
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    bulk = tasks.record.using(queue="sharded").enqueue_many(
        [Call([f"j{i}"], job_id=f"j{i}", priority=i % 3) for i in range(40)]
        + [Call(["later"], job_id="later", run_at=soon)])
    assert bulk.enqueued == 41
    assert len({broker.keys_for("sharded", f"j{i}").tag for i in range(40)}) == 4
    queue = Queue("sharded")
    assert queue.counts()["ready"] == 40
    assert queue.counts()["scheduled"] == 1
    assert queue.next_due() is not None
    assert Job.fetch("j7", "sharded").args == ["j7"]
    assert Job.fetch("j7", "sharded").position() is not None
    assert Job.fetch("j5", "sharded").cancel()
    Job.fetch("later", "sharded").reschedule(delay=7200)
    assert len(queue.jobs("ready", limit=100)) == 39
    assert [j.id for j in queue.jobs("cancelled")] == ["j5"]
    assert Job.fetch("j5", "sharded").retry().status == "ready"
    queue.pause()
    assert sum(len(r.jobs) for r in broker.claim("sharded", 10, "w")) == 0
    queue.resume()
    claimed = broker.claim("sharded", 100, "w")
    assert sum(len(r.jobs) for r in claimed) == 40
    assert queue.counts()["active"] == 40
    assert queue.purge(("scheduled",)) == 1
    assert queue.counts()["scheduled"] == 0


def test_delayed_jobs_start_on_time_with_markers_watched_per_shard(on_cluster, redis_client):
    jobs = [tasks.count_run.using(queue="sharded", delay=0.3 + i * 0.1).enqueue(f"d{i}")
            for i in range(8)]
    with worker_thread(queues=["sharded"]) as worker:
        assert worker._watch is not None, "one watcher per shard marker on a cluster"
        wait_until(lambda: all(j.refresh().status == "completed" for j in jobs),
                   message="delayed jobs on the cluster")
    for job in jobs:
        assert job.started_at >= job.run_at


def test_thousands_of_jobs_drained_by_worker_processes_once_each_in_priority_order(
        on_cluster, cluster):
    n = 3000
    client = on_cluster.client
    tasks.count_run.using(queue="drain").enqueue_many(
        Call([f"t{i}"], job_id=f"t{i}", priority=(i * 7) % 5 - 2) for i in range(n))
    procs = start_workers(3, "drain", {"QUEUES": QUEUES}, redis_url=cluster.url)
    try:
        wait_until(lambda: Queue("drain").counts()["completed"] == n, timeout=90,
                   interval=0.2, message=f"{n} jobs drained")
    finally:
        stop_workers(procs)
    counts = client.hgetall("test:count")
    assert len(counts) == n
    assert set(counts.values()) == {"1"}, "every job ran exactly once"
    by_shard: dict[str, list[tuple[int, int, int]]] = {}
    for job in Queue("drain").jobs("completed", limit=n):
        index = int(job.id[1:])
        by_shard.setdefault(on_cluster.keys_for("drain", job.id).tag, []).append(
            (-job.priority, index, round(job.started_at.timestamp() * 1000)))
    assert len(by_shard) == 4
    for jobs in by_shard.values():
        # claim order within a shard: higher priority first, FIFO within a priority
        starts = [started for _, _, started in sorted(jobs)]
        assert starts == sorted(starts)


def test_rate_limit_holds_over_all_shards_and_four_worker_processes(on_cluster, cluster,
                                                                     redis_client):
    rate = 20
    client = on_cluster.client
    tasks.record.using(queue="metered").enqueue_many([[f"m{i}"] for i in range(rate * 13)])
    procs = start_workers(4, "metered", {"QUEUES": QUEUES}, redis_url=cluster.url)
    try:
        wait_until(lambda: client.llen("test:ran") >= rate * 11 + 5, timeout=60,
                   interval=0.2, message="eleven seconds of limited jobs")
    finally:
        stop_workers(procs)
    # the tasks noted when they began running (Redis clock): the rate over ten seconds
    starts = sorted(r["redis_ms"] for r in ran(client))
    in_ten_seconds = sum(1 for t in starts if t < starts[0] + 10_000)
    assert rate * 10 * 0.9 <= in_ten_seconds <= rate * 10 * 1.1, in_ten_seconds
    # the claims (the starts the limiter counts) never exceed the rate in any second
    claims = sorted(round(j.started_at.timestamp() * 1000)
                    for j in Queue("metered").jobs("completed", limit=1000))
    assert most_in_any_window(claims, 1000) <= rate
    assert len({r["pid"] for r in ran(client)}) >= 3


def test_sharded_interval_queue_never_starts_two_jobs_closer(on_cluster, cluster):
    assert on_cluster.reserves_starts("spaced")
    jobs = [tasks.record.using(queue="spaced").enqueue(f"s{i}") for i in range(12)]
    procs = start_workers(3, "spaced", {"QUEUES": QUEUES}, redis_url=cluster.url)
    try:
        wait_until(lambda: on_cluster.client.llen("test:ran") == 12, timeout=30)
    finally:
        stop_workers(procs)
    starts = sorted(round(j.refresh().started_at.timestamp() * 1000) for j in jobs)
    assert min(b - a for a, b in itertools.pairwise(starts)) >= 200


def test_cluster_flag_with_a_plain_url_and_one_worker_on_two_queues(settings, cluster):
    from django_delayq.connection import get_broker

    plain_url = cluster.url.replace("redis+cluster://", "redis://")
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": plain_url, "CLUSTER": True}
    broker = get_broker()
    assert broker.is_cluster
    broker.client.flushall()
    first = tasks.count_run.enqueue("a")
    second = tasks.record_other.using(delay=0.5).enqueue("b")
    with worker_thread(queues=["default", "other"]) as worker:
        assert worker._watch is not None, "two hash tags: a watcher each"
        wait_until(lambda: second.refresh().status == "completed", message="both queues")
    assert first.refresh().status == "completed"
    assert second.started_at >= second.run_at


def test_single_enqueues_on_a_cluster_keep_the_client_path(on_cluster):
    broker = on_cluster
    assert broker._held is None  # a cluster client routes each call by its keys' slot
    jobs = [tasks.record.using(queue="sharded").enqueue(f"c{i}") for i in range(20)]
    assert all(job.created for job in jobs)
    assert {Job.fetch(job.id, queue="sharded").status for job in jobs} == {"ready"}
