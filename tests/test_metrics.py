"""The Prometheus view: figures after a known run, read from Redis counters."""

from __future__ import annotations

from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from prometheus_client.parser import text_string_to_metric_families

from django_delayq import Queue
from django_delayq.engine.stats import HISTOGRAM_MS, queue_stats
from django_delayq.mirror import Mirror
from tests.conftest import wait_until, worker_thread
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

    m = scrape(client)
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


def test_histogram_buckets_follow_the_scripts(broker, redis_client):
    """The buckets the Lua scripts count are the ones the reader names."""
    job = tasks.record.enqueue("bucket")
    with worker_thread(queues=["default"]):
        wait_until(lambda: job.refresh().is_finished, message="the job")
    stored = redis_client.hgetall(broker.keys_for("default", job.id).stats)
    buckets = [k for k in stored if k.startswith("hd:") and k != "hd:sum"]
    assert len(buckets) == 1
    index = int(buckets[0].split(":")[1])
    duration_ms = (job.finished_at - job.started_at).total_seconds() * 1000
    upper = ([*HISTOGRAM_MS, float("inf")])[index - 1]
    lower = ([0, *HISTOGRAM_MS])[index - 1]
    assert lower <= duration_ms <= upper
    assert queue_stats(broker, ["default"])["default"].duration.count == 1


def test_redis_down_is_a_503_without_the_url(client):
    dead = {**settings.DELAYQ, "REDIS_URL": "redis://:s3cret-pw@127.0.0.1:1/0",
            "SOCKET_CONNECT_TIMEOUT": 0.2}
    with override_settings(DELAYQ=dead):
        response = client.get(URL)
    assert response.status_code == 503
    assert b"s3cret" not in response.content
    assert b"Redis is unreachable" in response.content
