"""The Prometheus view: figures after a known run, read from Redis counters."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families
from redis.exceptions import OutOfMemoryError

from django_delayq import Job, Queue
from django_delayq.engine.stats import HISTOGRAM_MS
from django_delayq.metrics import queue_names
from django_delayq.mirror import Mirror
from django_delayq.runtime.worker import acks
from tests.conftest import ran, round_trips, wait_until, worker_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

URL = "/metrics/delayq/"


def scrape(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = client.get(URL)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples}


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_figures_after_a_known_run(client, broker):
    done = [tasks.record.enqueue(f"m{i}") for i in range(3)]
    failing = tasks.always_fails.using(max_attempts=2).enqueue("metrics")
    tasks.record.using(delay=3600).enqueue("later")
    tasks.record_other.enqueue("other")  # never run: its queue is paused
    Queue("other").pause()
    with worker_thread(queues=["default"]):
        wait_until(lambda: all(j.refresh().is_finished for j in [*done, failing]),
                   message="the jobs to finish")
        alive = scrape(client)
    assert failing.status == "failed"
    assert value(alive, "delayq_workers_alive") == 1
    # The worker serves "default" only: every other queue shows as unserved.
    assert value(alive, "delayq_queue_unserved", queue="default") == 0
    assert value(alive, "delayq_queue_unserved", queue="other") == 1

    m = scrape(client)
    assert value(m, "delayq_queue_unserved", queue="default") == 1  # its worker stopped
    d = {"queue": "default"}
    assert value(m, "delayq_jobs_enqueued_total", **d) == 5
    assert value(m, "delayq_jobs_started_total", **d) == 5  # 3 + the failing job twice
    assert value(m, "delayq_jobs_completed_total", **d) == 3
    assert value(m, "delayq_jobs_failed_total", **d) == 1
    assert value(m, "delayq_jobs_retried_total", **d) == 1
    assert value(m, "delayq_jobs_enqueued_total", queue="other") == 1
    assert value(m, "delayq_jobs_started_total", queue="other") == 0
    for status, n in {"waiting": 0, "scheduled": 1, "ready": 0, "active": 0, "completed": 3,
                      "failed": 1, "cancelled": 0}.items():
        assert value(m, "delayq_jobs", queue="default", status=status) == n, status
    assert value(m, "delayq_jobs", queue="other", status="ready") == 1
    assert value(m, "delayq_queue_paused", queue="other") == 1
    assert value(m, "delayq_queue_paused", **d) == 0
    assert value(m, "delayq_job_duration_seconds_count", **d) == 3
    assert value(m, "delayq_job_duration_seconds_bucket", le="+Inf", **d) == 3
    assert value(m, "delayq_job_start_lateness_seconds_count", **d) == 5
    assert value(m, "delayq_job_duration_seconds_sum", **d) >= 0
    assert value(m, "delayq_workers_alive") == 0  # the worker said goodbye
    # The mirror has not run: every event of the run waits for it.
    assert value(m, "delayq_mirror_lag_events", **d) > 0
    Mirror(block=0.1).run(burst=True)
    m = scrape(client)
    assert value(m, "delayq_mirror_lag_events", **d) == 0
    assert value(m, "delayq_mirror_lag_events", queue="other") == 0


def test_started_total_counts_starts_not_claims(client, broker, redis_client):
    """A claim is not a start: jobs claimed and handed back before any thread ran them
    (a stopping worker's release, a lost worker's reclaim) add nothing to the started
    total or to the lateness histogram; the run that follows adds one, when its start is
    noted and not again when its ack lands."""
    gate = "test:started-gate"
    job = tasks.gated.enqueue("once", gate)
    (lost,) = broker.claim("default", 1, "lost-worker")[0].jobs
    assert broker.reclaim_worker("lost-worker", [lost.keys]) == (1, 0)
    (stopping,) = broker.claim("default", 1, "stopping-worker")[0].jobs
    batch = broker.batch()
    broker.add_release(batch, stopping.keys, [(stopping.id, stopping.attempt)], started=False)
    assert batch.run() == [1]
    assert lost.id == stopping.id == job.id
    d = {"queue": "default"}
    m = scrape(client)
    assert value(m, "delayq_jobs_started_total", **d) == 0
    assert value(m, "delayq_job_start_lateness_seconds_count", **d) == 0
    with worker_thread(queues=["default"]):
        wait_until(lambda: job.refresh().status == "active", message="the start noted")
        m = scrape(client)
        assert value(m, "delayq_jobs_started_total", **d) == 1
        redis_client.set(gate, 1)
        wait_until(lambda: job.refresh().status == "completed", message="the job")
    m = scrape(client)
    assert value(m, "delayq_jobs_started_total", **d) == 1
    assert value(m, "delayq_job_start_lateness_seconds_count", **d) == 1
    assert job.attempts == 1


def test_every_dead_lettered_job_counts_once_in_the_failed_total(client, broker, redis_client):
    """A job reaches the failed set by its last attempt (fail.lua), by the policy of a
    parent that ended badly (in the parent's script, in the enqueue of a dependant whose
    parent had already failed, and through another queue's outbox) or by a damaged job
    key (the claim): each counts once, so the total is what the failed set holds."""
    parent = tasks.always_fails.using(max_attempts=1).enqueue("parent")
    child = tasks.record.using(depends_on=[parent], on_parent_failure="fail").enqueue("c")
    grandchild = tasks.record.using(depends_on=[child], on_parent_failure="fail").enqueue("g")
    elsewhere = tasks.record_other.using(depends_on=[parent],
                                         on_parent_failure="fail").enqueue("o")
    cancelled = tasks.record.using(delay=3600).enqueue("cancelled")
    of_cancelled = tasks.record.using(depends_on=[cancelled],
                                      on_parent_failure="fail").enqueue("oc")
    assert Job.fetch(cancelled.id).cancel()
    damaged = tasks.record.enqueue("damaged")
    job_key = broker.keys_for("default", damaged.id).job(damaged.id)
    redis_client.delete(job_key)
    redis_client.rpush(job_key, "junk")
    with worker_thread(queues=["default"]):
        wait_until(lambda: all(Job.fetch(j.id, j.queue).status == "failed" for j in
                               [parent, child, grandchild, elsewhere, damaged]),
                   message="the jobs to fail")
    late = tasks.record.using(depends_on=[parent], on_parent_failure="fail").enqueue("late")
    dead = [parent, child, grandchild, of_cancelled, damaged, late]
    assert all(Job.fetch(j.id).status == "failed" for j in dead)
    m = scrape(client)
    for queue, n in {"default": len(dead), "other": 1}.items():
        assert value(m, "delayq_jobs", queue=queue, status="failed") == n, queue
        assert value(m, "delayq_jobs_failed_total", queue=queue) == n, queue


def test_a_total_redis_lowers_holds_in_the_scrape(client, broker, redis_client):
    """A failover can lose a primary's last increments: the total stored in Redis goes
    back. What the view exports holds, counts on from there, and says since when."""
    done = [tasks.record.enqueue(f"t{i}") for i in range(5)]
    with worker_thread(queues=["default"]):
        wait_until(lambda: all(j.refresh().is_finished for j in done), message="the jobs")
    keys = broker.shards("default")[0]
    d = {"queue": "default"}
    first = scrape(client)
    began = value(first, "delayq_jobs_enqueued_created", **d)
    assert value(first, "delayq_jobs_enqueued_total", **d) == 5
    assert value(first, "delayq_job_duration_seconds_count", **d) == 5
    # Three enqueues and every duration lost, as a new primary that lacked them would be.
    redis_client.hset(keys.stats, "e", 2)
    redis_client.hdel(keys.stats, *[f for f in redis_client.hkeys(keys.stats)
                                    if f.startswith("hd:")])
    held = scrape(client)
    assert value(held, "delayq_jobs_enqueued_total", **d) == 5
    assert value(held, "delayq_job_duration_seconds_count", **d) == 5
    assert value(held, "delayq_jobs_completed_total", **d) == 5
    assert value(held, "delayq_jobs_enqueued_created", **d) == began
    tasks.record.enqueue("after")
    m = scrape(client)
    assert value(m, "delayq_jobs_enqueued_total", **d) == 6  # counts on from the figure
    assert Queue("default", broker=broker).summary().stats.enqueued == 6  # the same read
    # A Redis that lost everything (no persistence) lost the marks too: a true reset,
    # which the new start time says.
    redis_client.delete(keys.stats)
    tasks.record.enqueue("fresh")
    reset = scrape(client)
    assert value(reset, "delayq_jobs_enqueued_total", **d) == 1
    assert value(reset, "delayq_jobs_enqueued_created", **d) > began


def test_per_minute_counters_of_a_queue_busy_now_and_then_are_forgotten(broker, redis_client):
    """The scripts forget only the minute exactly 2 h back, so the minutes of a queue
    busy now and then (none counted 2 h after) stayed for good: the stats hash, and
    every read of it, grew without bound. The read drops them once there are more than
    the two kinds keep."""
    job = tasks.record.enqueue("minute")
    with worker_thread(queues=["default"]):
        wait_until(lambda: job.refresh().is_finished, message="the job")
    keys = broker.keys_for("default", job.id)
    now_minute = int(redis_client.time()[0]) // 60
    # What a job every 7 minutes for two days leaves (a minute 2 h later rarely has one).
    old = {f"c:{now_minute - 200 - 7 * i}": 1 for i in range(400)}
    redis_client.hset(keys.stats, mapping=old)
    summary = Queue("default", broker=broker).summary(detail=True)
    assert summary.stats.completed == 1
    left = redis_client.hkeys(keys.stats)
    assert not set(old) & set(left)
    assert f"c:{now_minute}" in left or f"c:{now_minute - 1}" in left  # the job's minute
    assert sum(completed for _, completed, _ in summary.throughput) == 1


def test_a_full_redis_still_answers_the_scrape(client, broker, redis_client):
    """Under ``noeviction`` (required) a full Redis refuses writes; the marks are one,
    but the figures are still read: the metrics stay up while Redis is full."""
    tasks.record.enqueue("before")
    assert value(scrape(client), "delayq_jobs_enqueued_total", queue="default") == 1
    tasks.record.enqueue("moved")  # a total that moved: its mark must be written
    redis_client.config_set("maxmemory", 1)
    try:
        with pytest.raises(OutOfMemoryError):
            redis_client.set("a write", "refused")
        m = scrape(client)
    finally:
        redis_client.config_set("maxmemory", 0)
    assert value(m, "delayq_jobs_enqueued_total", queue="default") == 2
    assert Queue("default", broker=broker).summary().stats.enqueued == 2


def test_reading_a_queue_that_never_counted_writes_nothing(client, broker, redis_client):
    """The read keeps marks so figures never go back, but a queue that has counted
    nothing has none to keep: reading it (any name, any number of times) leaves Redis
    as it was, so reads cannot grow it."""
    before = redis_client.dbsize()
    for name in ("never-used", "another"):
        assert Queue(name, broker=broker).summary().stats.enqueued == 0
    scrape(client)
    assert redis_client.dbsize() == before


def test_histogram_buckets_follow_the_scripts(broker, redis_client):
    """The buckets the Lua scripts count are the ones the reader names."""
    job = tasks.record.enqueue("bucket")
    with worker_thread(queues=["default"]):
        wait_until(lambda: job.refresh().is_finished, message="the job")
    stored = redis_client.hgetall(broker.keys_for("default", job.id).stats)
    buckets = [k for k in stored if k.startswith("hd:") and k != "hd:sum"]
    assert len(buckets) == 1
    index = int(buckets[0].split(":")[1])
    duration_ms = int(stored["hd:sum"])  # the one job's run time, as the worker measured it
    assert duration_ms <= (job.finished_at - job.started_at).total_seconds() * 1000 + 1
    upper = ([*HISTOGRAM_MS, float("inf")])[index - 1]
    lower = ([0, *HISTOGRAM_MS])[index - 1]
    assert lower <= duration_ms <= upper
    assert Queue("default", broker=broker).summary().stats.duration.count == 1


def test_the_duration_is_the_run_not_the_wait_for_the_ack(broker, redis_client, monkeypatch):
    """An outcome may wait in the worker before its ack is sent (a busy or backing-off
    acker): the duration histogram takes the run time the worker measured, not the time
    from the start to the ack. The ack is held here until Redis's clock is past the
    upper bound of the run's bucket, so the wait alone would land in another bucket."""
    arrived, release = threading.Event(), threading.Event()
    held: list[Any] = []
    send = acks.send_outcomes

    def held_send(broker_: Any, outcomes: Any, **kwargs: Any) -> Any:
        if outcomes and not held:
            held.extend(outcomes)
            arrived.set()
            assert release.wait(60), "the ack was never released"
        return send(broker_, outcomes, **kwargs)

    monkeypatch.setattr(acks, "send_outcomes", held_send)
    job = tasks.record.enqueue("held")
    with worker_thread(queues=["default"]):
        assert arrived.wait(60), "no outcome"
        (outcome,) = held
        ran_ms = outcome.finished_ms - outcome.started_ms
        bucket = next((i for i, ms in enumerate(HISTOGRAM_MS, 1) if ran_ms <= ms),
                      len(HISTOGRAM_MS) + 1)
        assert bucket <= len(HISTOGRAM_MS)  # a record() job runs for less than 5 minutes

        def redis_ms() -> int:
            seconds, micros = redis_client.time()
            return int(seconds) * 1000 + int(micros) // 1000

        wait_until(lambda: redis_ms() - outcome.started_ms > HISTOGRAM_MS[bucket - 1],
                   message="Redis's clock past the run's bucket")
        release.set()
        wait_until(lambda: job.refresh().status == "completed", message="the ack")
    stored = redis_client.hgetall(broker.keys_for("default", job.id).stats)
    assert {k: int(v) for k, v in stored.items() if k.startswith("hd:")} == {
        f"hd:{bucket}": 1, "hd:sum": ran_ms}


def test_redis_down_is_a_503_without_the_url(client):
    dead = {**settings.DELAYQ, "REDIS_URL": "redis://:s3cret-pw@127.0.0.1:1/0",
            "SOCKET_CONNECT_TIMEOUT": 0.2}
    with override_settings(DELAYQ=dead):
        response = client.get(URL)
    assert response.status_code == 503
    assert b"s3cret" not in response.content
    assert b"Redis is unreachable" in response.content


def commands_of_a_scrape(client: Client, redis_client: Any) -> dict[str, int]:
    """The Redis commands one scrape sends, by name (INFO commandstats around it)."""

    def calls() -> dict[str, int]:
        return {name.removeprefix("cmdstat_"): stats["calls"]
                for name, stats in redis_client.info("commandstats").items()}

    before = calls()
    scrape(client)
    after = calls()
    sent = {name: n - before.get(name, 0) for name, n in after.items()}
    sent["info"] -= 1  # the first INFO, counted once it ended
    return {name: n for name, n in sent.items() if n}


def test_a_scrape_sends_as_many_commands_at_10_jobs_as_at_10000(client, broker, redis_client):
    tasks.record.enqueue_many([(f"r{i}",) for i in range(5)])
    tasks.record.using(delay=3600).enqueue_many([(f"s{i}",) for i in range(5)])
    scrape(client)  # scripts loaded, the queues seen
    at_10 = commands_of_a_scrape(client, redis_client)
    tasks.record.enqueue_many([(f"r{i}",) for i in range(5, 5000)])
    tasks.record.using(delay=3600).enqueue_many([(f"s{i}",) for i in range(5, 5000)])
    assert sum(Queue("default").counts().values()) == 10_000
    at_10000 = commands_of_a_scrape(client, redis_client)
    assert at_10000 == at_10
    # A few per queue (one shard each): its 7 status sets and its jobs waiting for a
    # key's slot, its stats (the script and its read), whether it is paused, its next
    # due job, its busiest keys (2), its stream and the mirror's group; and 4 for the
    # queues and the workers.
    assert sum(at_10.values()) <= 16 * len(queue_names(broker)) + 4, at_10
    assert at_10["evalsha"] == len(queue_names(broker)), at_10
    m = scrape(client)
    assert value(m, "delayq_jobs", queue="default", status="ready") == 5000
    assert value(m, "delayq_jobs", queue="default", status="scheduled") == 5000


def test_a_scrape_of_5000_queues_costs_the_round_trips_of_a_few(client, broker):
    """Pipelined: the round trips of a scrape do not grow with the number of queues."""
    tasks.record.enqueue("x")
    with worker_thread(queues=["default"]):
        wait_until(lambda: Queue("default").counts()["completed"] == 1, message="the job")
        scrape(client)  # scripts loaded, the clock read
        with round_trips() as few:
            scrape(client)
        names = [f"q{i:04}" for i in range(5_000)]
        broker.client.sadd(broker.global_keys.queues, *names)
        tasks.record.using(queue="q0042", delay=60).enqueue("y")
        with round_trips() as many:
            m = scrape(client)
    assert len(queue_names(broker)) > 5_000
    assert value(m, "delayq_jobs", queue="q0042", status="scheduled") == 1
    assert value(m, "delayq_queue_unserved", queue="q0042") == 1
    assert value(m, "delayq_queue_unserved", queue="default") == 0
    # The clock's offset may be read again in between (once a minute): one more.
    assert len(few) <= len(many) <= len(few) + 1, (few, many)
    assert len(many) <= 10, many


def test_multiprocess_mode_with_the_pool_and_a_dead_child(client, redis_client, spawned,
                                                          tmp_path, monkeypatch):
    directory = tmp_path / "prometheus"
    directory.mkdir()
    jobs = [tasks.counts_in_prometheus.enqueue(f"p{i}") for i in range(6)]
    proc, out = spawned("default", "--processes", "2", "-c", "1",
                        env={"PROMETHEUS_MULTIPROC_DIR": str(directory)})
    wait_until(lambda: all(j.refresh().status == "completed" for j in jobs), timeout=60,
               message=f"the jobs to run in the pool:\n{out.text}")
    pids = {r["pid"] for r in ran(redis_client) if r["task"] == "counts_in_prometheus"}
    assert proc.pid not in pids
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    m = scrape(client)
    # The children's own metrics, merged from their files, next to the Redis figures.
    assert value(m, "tests_jobs_counted_total") == 6
    assert value(m, "tests_processes_counting") == len(pids)
    assert value(m, "delayq_jobs_completed_total", queue="default") == 6

    # A child dies: the supervisor drops its live gauge; what it counted still counts.
    victim = min(pids)
    os.kill(victim, signal.SIGKILL)
    wait_until(lambda: not (directory / f"gauge_livesum_{victim}.db").exists(), timeout=30,
               message=f"the supervisor to drop the dead child's live gauge:\n{out.text}")
    assert (directory / f"counter_{victim}.db").exists()
    m = scrape(client)
    assert value(m, "tests_jobs_counted_total") == 6
    # (No live file left, no sample: the victim may have run every job.)
    assert m.get(("tests_processes_counting", ()), 0) == len(pids) - 1
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
