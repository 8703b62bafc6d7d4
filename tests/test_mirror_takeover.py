"""A worker and its mirror process SIGKILLed while the mirror holds events it read but
did not write: the next ``delayq_mirror --burst`` takes them over at once (the worker's
heartbeat says it is gone), so it ends with nothing pending and every row equal to
Redis."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from django_delayq import Job
from django_delayq.connection import get_broker
from django_delayq.engine.workers import consumers_gone, mirror_consumer
from django_delayq.mirror import GROUP
from tests import services
from tests.conftest import ROOT, kill_with_children, wait_until
from tests.test_mirror_faults import pending, pg_database, pg_env, rows  # noqa: F401
from tests.testapp.tasks import record


@pytest.mark.postgres
def test_a_sigkilled_workers_pending_mirror_events_are_taken_over_by_a_burst(
        redis_client, pg_database):  # noqa: F811
    import psycopg

    _, name = pg_database
    broker = get_broker()
    keys = broker.shards("default")[0]
    waiting = [record.using(delay=3600).enqueue(f"w{i}") for i in range(30)]
    done = [record.enqueue(f"d{i}") for i in range(10)]
    # Hold the jobs' rows, so the worker's mirror reads a batch and blocks writing it.
    lock = psycopg.connect(services.pg_admin_dsn(name), connect_timeout=5)
    with lock.transaction():
        for job in [*waiting, *done]:
            lock.execute(
                "INSERT INTO django_delayq_job (job_id, queue, task_name, status, priority, "
                "args, kwargs, attempts, max_attempts, worker, error, traceback, "
                "last_event_id, updated_at, attempt_log, progress_message, parents) VALUES (%s, "
                "'default', '', 'ready', 0, '[]', '{}', 0, 1, '', '', '', '', now(), '[]', '', "
                "'[]')",
                (job.id,))
    lock.execute("SELECT id FROM django_delayq_job FOR UPDATE")
    worker = subprocess.Popen(
        [sys.executable, "-m", "django", "runworker", "default", "--name", "doomed", "-v", "0"],
        cwd=ROOT, env=pg_env(name), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: all(j.refresh().status == "completed" for j in done),
                   timeout=60, message="the worker ran the ready jobs")
        wait_until(lambda: pending(redis_client, keys.events) > 0, timeout=60,
                   message="the mirror read a batch")
        consumers = {c["name"]: c["pending"]
                     for c in redis_client.xinfo_consumers(keys.events, GROUP)}
        assert consumers.get(mirror_consumer("doomed"), 0) > 0, consumers
        assert consumers_gone(broker, [mirror_consumer("doomed")]) == set(), "still alive"
        kill_with_children(worker)  # the worker and its mirror process, mid-batch
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        lock.rollback()
        lock.close()
    assert consumers_gone(broker, [mirror_consumer("doomed")]) == {mirror_consumer("doomed")}
    # The default MIRROR_CLAIM_IDLE (60 s) would leave them pending: the heartbeat decides.
    drain = subprocess.run([sys.executable, "-m", "django", "delayq_mirror", "--burst"],
                           cwd=ROOT, env=pg_env(name), capture_output=True, text=True,
                           timeout=120)
    assert drain.returncode == 0, drain.stdout + drain.stderr
    assert "mirror took over a batch stream=" in drain.stderr
    assert pending(redis_client, keys.events) == 0
    found = rows(name)
    expected = {j.id: Job.fetch(j.id).status for j in [*waiting, *done]}
    assert found == expected


def test_consumers_of_ended_processes_on_this_host_are_gone(redis_client):
    broker = get_broker()
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    host = socket.gethostname()
    mine = f"{host}:{os.getpid()}:abc"
    other_host = f"elsewhere.example:{ended.pid}:abc"
    gone = f"{host}:{ended.pid}:abc"
    assert consumers_gone(broker, [mine, other_host, gone, "custom"]) == {gone}
    # a worker's mirror: gone once its record is gone, or its heartbeat is stale
    assert consumers_gone(broker, [mirror_consumer("never-seen")]) == {
        mirror_consumer("never-seen")}
    gk = broker.global_keys
    now = broker.server_time_ms()
    redis_client.zadd(gk.workers, {"fresh": now, "stale": now - 60_000})
    redis_client.hset(gk.worker("fresh"), mapping={"host": "elsewhere", "pid": "1"})
    redis_client.hset(gk.worker("stale"), mapping={"host": "elsewhere", "pid": "1"})
    assert consumers_gone(broker, [mirror_consumer("fresh"), mirror_consumer("stale")]) == {
        mirror_consumer("stale")}


def test_events_delivered_just_before_their_consumer_died_are_taken_over_at_once(
        redis_client):
    """Entries a consumer read (with no batch recorded: read as a mirror before batches
    were, say) moments before it died: the next round takes them, without waiting for
    the take-over's idle time, and nobody else will ever touch them."""
    from django_delayq.mirror import Mirror

    broker = get_broker()
    keys = broker.shards("default")[0]
    redis_client.xgroup_create(keys.events, GROUP, id="0", mkstream=True)
    jobs = [record.using(delay=3600).enqueue(f"g{i}") for i in range(5)]
    ghost = mirror_consumer("never-registered")  # no worker record: certainly gone
    got = redis_client.xreadgroup(GROUP, ghost, {keys.events: ">"}, count=100)
    read = sum(len(entries) for _, entries in got)
    assert read >= len(jobs)
    mirror = Mirror(block=0.1, claim_idle=3600, name="me")
    assert mirror.run(burst=True) == read
    assert {c["name"]: c["pending"] for c in redis_client.xinfo_consumers(
        keys.events, GROUP)}.get(ghost, 0) == 0
