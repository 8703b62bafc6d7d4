"""Redis not serving, on each kind of URL (one server, a Cluster, Sentinel): every
surface raises or answers the project's own error (``DelayQConnectionError``, a 503,
``delayq_health`` exit 4 in one line), nothing needs Redis inside a caller's transaction,
and ``runworker`` (its worker, mirror and relay) waits for Redis and goes on."""

from __future__ import annotations

import signal
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from django_delayq import DelayQConnectionError, Job, Queue
from django_delayq.models import OutboxEntry
from django_delayq.outbox import OUTBOX
from tests.conftest import ROOT, migrated_sqlite, sqlite_rows, wait_until, worker_env
from tests.servers import RedisCluster
from tests.testapp import tasks

#: A URL of each kind where nothing answers.
DOWN = {
    "plain": "redis://:s3cret-pw@127.0.0.1:1/0",
    "cluster": "redis+cluster://:s3cret-pw@127.0.0.1:1,127.0.0.1:2",
    "sentinel": "redis+sentinel://:s3cret-pw@127.0.0.1:1,127.0.0.1:2/mymaster/0",
}


@pytest.fixture(params=list(DOWN))
def down_url(request: Any, settings: Any) -> str:
    url: str = DOWN[request.param]
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": url, "SOCKET_CONNECT_TIMEOUT": 0.5,
                       "SOCKET_TIMEOUT": 0.5, "FAILOVER_RETRY": 0.5}
    return url


def test_every_producer_and_reader_call_raises_the_projects_error(down_url):
    calls = {
        "enqueue": lambda: tasks.record.enqueue("down"),
        "enqueue_many": lambda: tasks.record.enqueue_many([tasks.record.bind("a")]),
        "fetch": lambda: Job.fetch("some-id"),
        "counts": lambda: Queue("default").counts(),
        "queues": lambda: Queue.all(),
    }
    for name, call in calls.items():
        with pytest.raises(DelayQConnectionError) as info:
            call()
        assert "s3cret" not in str(info.value), name
        assert "<redis." not in str(info.value), f"{name}: a client's repr: {info.value}"


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_raises_the_projects_error_after_the_commit(down_url):
    def commit() -> None:
        with transaction.atomic():
            User.objects.create_user("committed")
            tasks.record.enqueue_on_commit("down")

    with pytest.raises(DelayQConnectionError):
        commit()
    assert User.objects.filter(username="committed").exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_in_transaction_commits_and_leaves_its_row_for_the_relay(down_url):
    with transaction.atomic():
        User.objects.create_user("committed")
        job = tasks.record.enqueue_in_transaction("down")
    assert User.objects.filter(username="committed").exists()
    (row,) = OutboxEntry.objects.all()
    assert (row.job_id, row.parked_at, job.status) == (job.id, None, OUTBOX)


@pytest.mark.django_db
def test_the_api_and_the_metrics_view_answer_503(down_url):
    client = Client()
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    for path in ("/api/delayq/queues/", "/api/delayq/workers/", "/metrics/delayq/"):
        response = client.get(path)
        assert response.status_code == 503, (path, response.content[:500])
        assert b"s3cret" not in response.content


def test_delayq_health_exits_4_with_one_line(down_url):
    done = subprocess.run(
        [sys.executable, "-m", "django", "delayq_health", "--timeout", "3"], cwd=ROOT,
        env=worker_env(down_url, DELAYQ_TEST_SETTINGS='{"SOCKET_CONNECT_TIMEOUT": 0.5}'),
        capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 4, done.stderr
    assert done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "s3cret" not in done.stderr
    assert "<redis." not in done.stderr  # no client's repr


def test_runworker_waits_for_a_cluster_with_no_node_then_runs_and_mirrors(spawned, tmp_path,
                                                                          settings):
    """Started while no node of its Cluster answers, ``runworker`` (its worker process,
    mirror and relay) waits with backoff, runs and mirrors jobs once the Cluster is
    back, and stops with exit 0 and no traceback."""
    db = migrated_sqlite(tmp_path)
    with RedisCluster() as own:
        for node in own.nodes:
            node.stop()
        proc, out = spawned("default", redis_url=own.url, env={"DELAYQ_TEST_SQLITE": db})
        out.wait_for("mirror cannot reach Redis", timeout=60)
        out.wait_for("redis unavailable", "heartbeat failed", timeout=60)
        for node in own.nodes:
            node.start()
        settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": own.url}

        def enqueued() -> Job | None:
            try:
                return tasks.record.enqueue("after")
            except DelayQConnectionError:
                return None

        job = wait_until(enqueued, timeout=60, message="the cluster back")
        wait_until(lambda: job.refresh().status == "completed", timeout=60,
                   message=f"the job run once the cluster is back:\n{out.text}")
        wait_until(lambda: sqlite_rows(db).get(job.id) == "completed", timeout=60,
                   message=f"the job mirrored:\n{out.text}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.text
    assert "Traceback" not in out.text, out.text

