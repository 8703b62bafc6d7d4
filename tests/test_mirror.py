"""The model mirror: events streams -> Job rows, idempotent, losing nothing on a crash.

Every test here also runs on PostgreSQL (``test_mirror_tests_pass_on_postgresql``).
"""

from __future__ import annotations

import datetime as dt
import io
import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection, connections
from django.test import override_settings
from django.utils import timezone

from django_delayq import Job as EngineJob
from django_delayq import Queue
from django_delayq.connection import engine_config, get_broker
from django_delayq.engine import Broker
from django_delayq.engine.fields import stored
from django_delayq.engine.keys import QueueKeys
from django_delayq.mirror import GROUP, Mirror
from django_delayq.mirror import consumer as consumer_module
from django_delayq.models import Job
from django_delayq.testing import RedisServer
from tests.conftest import (
    ROOT,
    OutputReader,
    rerun_on_postgresql,
    sqlite_query,
    sqlite_rows,
    wait_until,
    worker_env,
    worker_thread,
)
from tests.testapp import tasks

KEYS = QueueKeys("dq", "default")


def mirror_all(**kwargs: Any) -> Mirror:
    mirror = Mirror(block=0.1, **kwargs)
    mirror.run(burst=True)
    return mirror


def snapshot() -> dict[str, tuple[Any, ...]]:
    return {row.job_id: (row.status, row.attempts, row.result, row.error, row.started_at,
                         row.finished_at, row.last_event_id, row.updated_at)
            for row in Job.objects.all()}


def pending(client: Any, keys: QueueKeys = KEYS) -> int:
    return int(client.xpending(keys.events, GROUP)["pending"])


@pytest.mark.django_db
def test_rows_follow_a_real_worker_run(redis_client):
    done = tasks.record.using(priority=5).enqueue("a", extra={"k": [1, 2]})
    failed = tasks.always_fails.enqueue("f")
    later = tasks.record.using(delay=3600).enqueue("later")
    cancelled = tasks.record.using(delay=3600).enqueue("gone")
    cancelled.cancel()
    with worker_thread(queues=["default"]):
        wait_until(lambda: done.refresh().status == "completed"
                   and failed.refresh().status == "failed", message="jobs to finish")
    mirror = mirror_all()
    assert mirror.mirrored == len(redis_client.xrange(KEYS.events))
    rows = {row.job_id: row for row in Job.objects.all()}
    assert set(rows) == {done.id, failed.id, later.id, cancelled.id}
    row = rows[done.id]
    assert (row.queue, row.task_name, row.status, row.priority) == (
        "default", tasks.record.name, "completed", 5)
    assert (row.args, row.kwargs, row.result, row.attempts) == (["a"], {"extra": {"k": [1, 2]}},
                                                                "a", 1)
    assert row.started_at == done.started_at
    assert row.finished_at == done.finished_at
    assert row.run_at == done.run_at
    assert row.enqueued_at == done.enqueued_at
    assert row.worker
    row = rows[failed.id]
    assert (row.status, row.attempts, row.error) == ("failed", 3, "builtins.RuntimeError: boom f")
    assert "Traceback (most recent call last)" in row.traceback
    assert rows[later.id].status == "scheduled"
    assert rows[later.id].run_at == later.run_at
    assert rows[cancelled.id].status == "cancelled"
    assert pending(redis_client) == 0


@pytest.mark.django_db
def test_rows_follow_a_worker_run_with_use_tz_off(redis_client):
    """With ``USE_TZ = False`` Django stores naive local times, and SQLite and MySQL
    refuse aware ones: the mirror writes every time as Django would."""
    with override_settings(USE_TZ=False, TIME_ZONE="America/New_York"):
        done = tasks.record.enqueue_many([[i] for i in range(200)])
        later = tasks.record.using(delay=3600).enqueue("later")
        with worker_thread(queues=["default"]):
            wait_until(lambda: Queue("default").counts()["completed"] == 200,
                       message="200 jobs to complete")
        mirror = mirror_all()
        assert (mirror.mirrored, mirror.skipped) == (len(redis_client.xrange(KEYS.events)), 0)
        rows = {row.job_id: row for row in Job.objects.all()}
        assert set(rows) == {*done.job_ids, later.id}
        assert {rows[j].status for j in done.job_ids} == {"completed"}
        job = EngineJob.fetch(done.job_ids[0], "default")
        row = rows[job.id]
        new_york = timezone.get_default_timezone()
        assert row.finished_at == timezone.make_naive(job.finished_at, new_york)
        assert row.enqueued_at == timezone.make_naive(job.enqueued_at, new_york)
        assert rows[later.id].run_at == timezone.make_naive(later.run_at, new_york)
    assert pending(redis_client) == 0


@pytest.mark.django_db
def test_a_bulk_enqueue_entry_makes_a_row_per_job(redis_client):
    bulk = tasks.record.enqueue_many([[i] for i in range(1_250)], chunk_size=500)
    assert len(redis_client.xrange(KEYS.events)) == 3  # one entry per chunk
    mirror = mirror_all(batch_size=200)  # more jobs in one read than in one transaction
    assert mirror.mirrored == 3
    rows = dict(Job.objects.values_list("job_id", "status"))
    assert rows == dict.fromkeys(bulk.job_ids, "ready")
    assert pending(redis_client) == 0


@pytest.mark.django_db
def test_a_row_leaves_scheduled_when_its_job_is_promoted(broker, redis_client):
    Queue("default").pause()  # claims promote due jobs but start none
    jobs = [tasks.record.using(delay=0.05).enqueue(i) for i in range(3)]
    mirror_all()
    assert set(Job.objects.values_list("status", flat=True)) == {"scheduled"}
    due_ms = max(job.run_at for job in jobs).timestamp() * 1000
    wait_until(lambda: broker.server_time_ms() > due_ms, message="the jobs to fall due")
    (claim,) = broker.claim("default", 10, "w")
    assert (claim.jobs, claim.paused) == ([], True)
    (entry,) = [fields for _, fields in redis_client.xrange(KEYS.events)
                if fields["event"] == "promoted"]
    assert sorted(entry["jobs"].split(" ")) == sorted(job.id for job in jobs)
    mirror_all()
    assert dict(Job.objects.values_list("job_id", "status")) == {j.id: "ready" for j in jobs}


@pytest.mark.django_db
def test_replaying_every_event_changes_nothing(redis_client):
    jobs = [tasks.record.enqueue(f"r{i}") for i in range(5)]
    with worker_thread(queues=["default"]):
        wait_until(lambda: all(j.refresh().status == "completed" for j in jobs),
                   message="jobs to complete")
    mirror_all()
    before = snapshot()
    assert len(before) == 5
    assert {v[0] for v in before.values()} == {"completed"}
    redis_client.xgroup_setid(KEYS.events, GROUP, "0")  # deliver every event again
    again = mirror_all()
    assert again.mirrored == len(redis_client.xrange(KEYS.events))
    assert snapshot() == before
    assert Job.objects.count() == 5


@pytest.mark.django_db
def test_an_older_event_never_overwrites_a_newer_state(broker, redis_client):
    job = tasks.record.using(delay=3600).enqueue("x")
    mirror_all()
    job.cancel()
    mirror_all()
    row = Job.objects.get(job_id=job.id)
    assert row.status == "cancelled"
    newest = row.last_event_id
    # Redeliver the old "enqueued" event alone, with the hash reporting a fresh state.
    first_id = redis_client.xrange(KEYS.events)[0][0]
    redis_client.hset(KEYS.job(job.id), stored("status"), "ready")
    mirror = Mirror(block=0.1)
    mirror.apply(KEYS, [(first_id, {"event": "enqueued", "job": job.id, "ts": "1"})])
    row.refresh_from_db()
    assert (row.status, row.last_event_id) == ("cancelled", newest)


@pytest.mark.django_db
def test_event_of_an_expired_job_still_updates_status_and_times(redis_client):
    job = tasks.record.enqueue("gone")
    with worker_thread(queues=["default"]):
        wait_until(lambda: job.refresh().status == "completed", message="job to complete")
    redis_client.delete(KEYS.job(job.id))  # as the result TTL would
    mirror_all()
    row = Job.objects.get(job_id=job.id)
    completed = next(f for _, f in redis_client.xrange(KEYS.events) if f["event"] == "completed")
    assert row.status == "completed"
    assert row.finished_at == dt.datetime.fromtimestamp(int(completed["ts"]) / 1000, dt.UTC)
    assert row.attempts == 1
    assert row.started_at is not None


@pytest.mark.django_db
def test_a_claim_and_an_ack_of_several_jobs_write_one_entry_each(broker, redis_client):
    jobs = [tasks.record.enqueue(i) for i in range(3)]
    (claim,) = broker.claim("default", 10, "w1")
    assert [j.id for j in claim.jobs] == [j.id for j in jobs]
    batch = broker.batch()
    broker.add_complete(batch, KEYS, [(j.id, j.attempt, "null") for j in claim.jobs])
    assert batch.run() == [[1, 1, 1]]
    kinds = [f["event"] for _, f in redis_client.xrange(KEYS.events)]
    # one entry per call; the ack says they started (no thread's start note came first)
    assert kinds == ["enqueued"] * 3 + ["claimed", "started", "completed"]
    claimed, started = (f for _, f in redis_client.xrange(KEYS.events)[3:5])
    assert (claimed["jobs"], claimed["attempts"], claimed["worker"]) == (
        " ".join(j.id for j in jobs), "1 1 1", "w1")
    assert (started["jobs"], started["attempts"]) == (" ".join(j.id for j in jobs), "1 1 1")
    for job in jobs:
        redis_client.delete(KEYS.job(job.id))  # as the result TTL would: events alone
    mirror_all()
    rows = {row.job_id: row for row in Job.objects.all()}
    assert {(r.status, r.attempts, r.worker) for r in rows.values()} == {("completed", 1, "w1")}
    assert all(r.started_at and r.finished_at for r in rows.values())


@pytest.mark.django_db
def test_rows_built_from_events_keep_what_their_hashes_wrote(redis_client):
    """A mirror that lags past ``KEEP_COMPLETED`` finds hundreds of finished jobs' hashes
    gone: each row takes its events' state, keeps the arguments it already held, and a
    job the mirror never saw gets a row of its events alone (no task, no arguments)."""
    extra = {"when": "2026-11-29T10:00:00+00:00", "n": [1, 2.5, None], "text": "é\u2028"}
    seen = [tasks.record.using(priority=i % 3).enqueue(f"t{i}", extra=extra)
            for i in range(150)]
    mirror_all()  # each row as its hash holds it: ready, with its arguments
    unseen = [tasks.record.using(priority=2).enqueue(f"u{i}") for i in range(150)]
    jobs = seen + unseen
    with worker_thread(queues=["default"], concurrency=4):
        wait_until(lambda: Queue("default").counts()["completed"] == len(jobs),
                   message="jobs to complete")
    redis_client.delete(*(KEYS.job(job.id) for job in jobs))  # as KEEP_COMPLETED would
    mirror_all()
    rows = {row.job_id: row for row in Job.objects.all()}
    assert len(rows) == len(jobs)
    for i, job in enumerate(seen):
        row = rows[job.id]
        assert (row.status, row.attempts, row.priority, row.task_name) == (
            "completed", 1, i % 3, "tests.testapp.tasks.record"), job.id
        assert (row.args, row.kwargs) == ([f"t{i}"], {"extra": extra}), job.id
    for job in unseen:
        row = rows[job.id]
        assert (row.status, row.attempts, row.priority, row.task_name, row.max_attempts) == (
            "completed", 1, 0, "", 1), job.id
        assert (row.args, row.kwargs, row.result, row.parents) == ([], {}, None, []), job.id
    for row in rows.values():
        assert row.worker, row.job_id
        assert row.enqueued_at <= row.started_at <= row.finished_at, row.job_id
    assert pending(redis_client) == 0


@pytest.mark.django_db
def test_rows_of_jobs_gone_from_redis_are_marked_and_shown_so(redis_client, admin_client):
    """A job lost in a failover (here: its keys deleted) leaves a row that would say
    "scheduled" for ever: the reconciliation marks it, the admin and the API show it,
    and an event of the job (enqueued again with its id) clears the mark."""
    lost, kept = (tasks.record.using(delay=3600).enqueue(tag) for tag in ("lost", "kept"))
    done = tasks.record.enqueue("done")
    with worker_thread(queues=["default"]):
        wait_until(lambda: done.refresh().status == "completed", message="a job run")
    mirror = mirror_all()
    keys = get_broker().keys_for("default", lost.id)
    redis_client.delete(keys.job(lost.id))
    redis_client.zrem(keys.scheduled, lost.id)
    redis_client.delete(get_broker().keys_for("default", done.id).job(done.id))
    assert mirror.reconcile(quiet_for=3600) == 0, "rows written within quiet_for wait"
    assert mirror.reconcile(quiet_for=0) == 1
    rows = {row.job_id: row for row in Job.objects.all()}
    assert rows[lost.id].missing_at is not None
    assert rows[lost.id].status == "scheduled", "the last status mirrored stays"
    assert rows[kept.id].missing_at is None
    assert rows[done.id].missing_at is None, "a finished job may expire"
    page = admin_client.get("/admin/django_delayq/job/?missing_at__isnull=False")
    assert page.status_code == 200
    assert b"gone from Redis" in page.content
    assert lost.id.encode() in page.content
    assert kept.id.encode() not in page.content
    body = admin_client.get("/api/delayq/jobs/?queue=default").json()
    shown = {job["job_id"]: job["missing_at"] for job in body["results"]}
    assert shown[lost.id] is not None
    assert shown[kept.id] is None
    tasks.record.using(job_id=lost.id, delay=3600).enqueue("lost")
    mirror_all()
    assert Job.objects.get(job_id=lost.id).missing_at is None


@pytest.mark.django_db
def test_a_row_left_behind_by_a_dropped_history_is_rewritten_from_its_finished_job(
        redis_client):
    """A failover that drops the old primary's last writes can leave a row as of a
    position of that dropped history (here: an hour ahead), with a status the job has
    left: its own last events on the new primary seem older and are not written. The
    reconciliation rewrites it from the job's hash, as of the stream's real position, so
    the job's later events are written again; a row that agrees is left alone."""
    done, other = tasks.record.enqueue("done"), tasks.record.enqueue("other")
    with worker_thread(queues=["default"]):
        wait_until(lambda: {done.refresh().status, other.refresh().status} == {"completed"},
                   message="the jobs run")
    mirror = mirror_all()
    ahead = int(timezone.now().timestamp() * 1000) + 3_600_000
    old = timezone.now() - dt.timedelta(hours=1)
    Job.objects.filter(job_id=done.id).update(
        status="active", finished_at=None, last_event_ms=ahead, last_event_seq=0,
        last_event_id=f"{ahead}-0", updated_at=old)
    assert mirror.reconcile(quiet_for=7200) == 0, "rows written within quiet_for wait"
    assert Job.objects.get(job_id=done.id).status == "active"
    assert mirror.reconcile(quiet_for=0) == 1
    row = Job.objects.get(job_id=done.id)
    assert (row.status, row.missing_at) == ("completed", None)
    assert row.finished_at is not None
    newest = redis_client.xrevrange(KEYS.events, count=1)[0][0]
    assert row.last_event_id == newest, "as of the stream's own position, not the dropped one"
    assert Job.objects.get(job_id=other.id).status == "completed"
    assert mirror.reconcile(quiet_for=0) == 0, "nothing left to put right"


@pytest.mark.django_db
def test_reconciliation_reaches_every_quiet_row_however_many_wait(redis_client, monkeypatch):
    """More quiet unfinished rows than one round checks (a backlog due tomorrow is quiet,
    unfinished and right): each round goes on where the last one ended, so the rows of
    lost jobs are marked even behind a newer backlog."""
    monkeypatch.setattr(consumer_module, "RECONCILE_CHUNK", 3)
    backlog = [tasks.record.using(delay=3600).enqueue(f"b{i}") for i in range(5)]
    lost = [tasks.record.using(delay=3600).enqueue(f"lost{i}") for i in range(2)]
    mirror = mirror_all()
    Job.objects.filter(job_id__in=[j.id for j in backlog]).update(
        enqueued_at=timezone.now() + dt.timedelta(hours=1))  # the newest rows
    for job in lost:
        keys = get_broker().keys_for("default", job.id)
        redis_client.delete(keys.job(job.id))
        redis_client.zrem(keys.scheduled, job.id)
    assert sum(mirror.reconcile(quiet_for=0) for _ in range(3)) == 2, "7 rows, 3 a round"
    missing = set(Job.objects.filter(missing_at__isnull=False).values_list("job_id",
                                                                          flat=True))
    assert missing == {job.id for job in lost}


@pytest.mark.django_db
def test_a_redis_refusing_the_jobs_read_stalls_the_batch_and_skips_no_event(redis_client,
                                                                            caplog):
    """Redis refuses the read of the jobs' hashes (here its ACL; a slot on the move
    answers TRYAGAIN alike): no job is to blame, so none is skipped. The batch waits
    unacknowledged, and is written once Redis serves the read again."""
    jobs = [tasks.record.using(delay=3600).enqueue(f"acl{i}") for i in range(3)]
    user = "mirror-no-hgetall"
    redis_client.acl_setuser(user, enabled=True, passwords=["+mirror-pw"],
                             categories=["+@all"], commands=["-hgetall"], keys=["*"],
                             channels=["*"])
    url = settings.DELAYQ["REDIS_URL"].replace("redis://", f"redis://{user}:mirror-pw@", 1)
    try:
        broker = Broker(redis.Redis.from_url(url, decode_responses=True), engine_config())
        mirror = Mirror(broker=broker, block=0.1, name="m1", claim_idle=3600)
        mirror.run(timeout=0.5)
        assert "hgetall" in caplog.text.lower()
        assert (mirror.skipped, pending(redis_client), Job.objects.count()) == (0, 3, 0)
        redis_client.acl_setuser(user, enabled=True, commands=["+hgetall"])
        mirror.run(burst=True, timeout=15)
    finally:
        redis_client.acl_deluser(user)
    assert {row.job_id for row in Job.objects.all()} == {job.id for job in jobs}
    assert (mirror.skipped, pending(redis_client)) == (0, 0)


@pytest.mark.django_db
def test_a_column_missing_before_migrate_stalls_the_batch_and_skips_no_event(redis_client,
                                                                             caplog):
    """Code deployed before ``migrate`` writes a column the table lacks (here: renamed
    away). PostgreSQL answers ProgrammingError, SQLite OperationalError: neither is the
    fault of one job, so none is skipped; the batch is written once the column is back."""
    jobs = [tasks.record.using(delay=3600).enqueue(f"col{i}") for i in range(3)]
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE django_delayq_job RENAME COLUMN attempts TO away")
    mirror = Mirror(block=0.1, name="m1", claim_idle=3600)
    mirror.run(timeout=0.5)
    assert "cannot write to the database" in caplog.text
    assert (mirror.skipped, pending(redis_client)) == (0, 3)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE django_delayq_job RENAME COLUMN away TO attempts")
    mirror.run(burst=True, timeout=15)
    assert {row.job_id for row in Job.objects.all()} == {job.id for job in jobs}
    assert (mirror.skipped, pending(redis_client)) == (0, 0)


@pytest.mark.django_db
def test_purged_jobs_are_marked_purged(redis_client):
    job = tasks.record.using(delay=3600).enqueue("p")
    mirror_all()
    assert Queue("default").purge() == 1
    mirror_all()
    row = Job.objects.get(job_id=job.id)
    assert row.status == "purged"
    assert row.args == ["p"]


@pytest.mark.django_db
def test_garbled_events_are_skipped_acked_and_do_not_stop_the_rest(redis_client, caplog):
    tasks.record.enqueue("ok")
    redis_client.xadd(KEYS.events, {"nonsense": "1"})
    redis_client.xadd(KEYS.events, {"event": "completed", "job": "x", "ts": "not-a-number"})
    mirror = mirror_all()
    assert mirror.skipped == 2
    assert Job.objects.count() == 1
    assert pending(redis_client) == 0
    skips = [r for r in caplog.records if "skipped an event" in r.getMessage()]
    assert [r.reason.split(":")[0] for r in skips] == ["garbled event"] * 2


@pytest.mark.django_db
def test_a_job_with_json_no_database_takes_is_mirrored_as_text_and_the_rest_too(redis_client,
                                                                                caplog):
    good = tasks.record.using(delay=3600).enqueue("good")
    bad = tasks.record.using(delay=3600).enqueue("bad")
    # valid to Python, not to a JSON column: kept as its text (and shown as damaged)
    redis_client.hset(KEYS.job(bad.id), stored("args"), "[NaN]")
    entry = redis_client.xadd(KEYS.events, {"event": "enqueued", "job": "x" * 200, "ts": "1"})
    mirror = mirror_all()
    assert sorted(Job.objects.values_list("job_id", flat=True)) == sorted([good.id, bad.id])
    assert Job.objects.get(job_id=bad.id).args == "[NaN]"
    assert mirror.skipped == 1
    assert pending(redis_client) == 0
    assert f'id={entry} reason="garbled event' in caplog.text


class FailingMirror(Mirror):
    """A mirror whose database is down: every write fails."""

    def _write(self, keys: QueueKeys, by_job: dict[str, Any]) -> None:
        raise OperationalError("database is down")


@pytest.mark.django_db
def test_database_outage_loses_no_event(redis_client, caplog):
    jobs = [tasks.record.using(delay=3600).enqueue(f"o{i}") for i in range(4)]
    down = FailingMirror(block=0.1, name="m1", claim_idle=3600)
    down.run(burst=False, timeout=0.3)  # logs, backs off, does not raise
    assert "cannot write to the database" in caplog.text
    assert pending(redis_client) == 4
    assert Job.objects.count() == 0
    # The same consumer, restarted, reads its own pending entries first.
    mirror_all(name="m1", claim_idle=3600)
    assert {r.job_id for r in Job.objects.all()} == {j.id for j in jobs}
    assert pending(redis_client) == 0


@pytest.mark.django_db
def test_a_dead_consumers_pending_events_are_taken_over(redis_client):
    jobs = [tasks.record.using(delay=3600).enqueue(f"t{i}") for i in range(3)]
    with pytest.raises(OperationalError):
        FailingMirror(block=0.1, name="dead").step()
    assert pending(redis_client) == 3
    mirror_all(name="other", claim_idle=3600)  # not idle long enough: left alone
    assert Job.objects.count() == 0
    mirror_all(name="other", claim_idle=0)
    assert Job.objects.count() == len(jobs)
    assert pending(redis_client) == 0


@pytest.mark.django_db
def test_redis_outage_is_logged_and_retried_without_raising(caplog):
    server = RedisServer(appendonly=True).start()
    try:
        client = redis.Redis.from_url(server.url, decode_responses=True, socket_timeout=1)
        broker = Broker(client, engine_config())
        job_id = broker.enqueue("default", tasks.record.name, ["r"]).job_id
        server.stop()
        mirror = Mirror(broker=broker, block=0.1)
        mirror.run(timeout=1.0)
        assert "cannot reach Redis" in caplog.text
        server.restart()
        mirror.run(burst=True, timeout=15)
        assert list(Job.objects.values_list("job_id", flat=True)) == [job_id]
    finally:
        server.cleanup()


def rename_table(old: str, new: str) -> bool:
    """Rename a table; False while another connection holds the database's lock."""
    try:
        with connection.cursor() as cursor:
            cursor.execute(f"ALTER TABLE {old} RENAME TO {new}")
    except OperationalError:
        return False
    return True


def row_exists(job_id: str) -> bool:
    """Whether the job has its row; False while the mirror thread holds the table's lock."""
    try:
        return Job.objects.filter(job_id=job_id).exists()
    except OperationalError:
        return False


@pytest.mark.django_db(transaction=True)
def test_mirror_thread_survives_a_lost_database_connection(caplog):
    seen: dict[str, Any] = {}

    class Recording(Mirror):
        def _write(self, keys: QueueKeys, by_job: dict[str, Any]) -> None:
            seen.setdefault("connection", connections["default"])  # the mirror thread's own
            super()._write(keys, by_job)

    mirror = Recording(block=0.1)

    def run() -> None:
        try:
            mirror.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        first = tasks.record.using(delay=3600).enqueue("before")
        wait_until(lambda: row_exists(first.id), message="first row")
        lost = seen["connection"]
        if lost.vendor == "postgresql":  # the server drops the mirror's connection
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_terminate_backend(%s)",
                               [lost.connection.info.backend_pid])
            second = tasks.record.using(delay=3600).enqueue("after")
        else:  # an in-memory SQLite cannot lose its connection: take the table away
            wait_until(lambda: rename_table("django_delayq_job", "delayq_away"),
                       message="the table renamed away")
            second = tasks.record.using(delay=3600).enqueue("after")
            wait_until(lambda: "cannot write to the database" in caplog.text,
                       message="the mirror to notice")
            # The mirror thread may hold the shared in-memory database's lock for a moment.
            wait_until(lambda: rename_table("delayq_away", "django_delayq_job"),
                       message="the table renamed back")
        wait_until(lambda: row_exists(second.id), message="second row")
    finally:
        mirror.request_stop()
        thread.join(10)
    assert not thread.is_alive()
    assert "mirror cannot write to the database" in caplog.text
    assert pending(get_broker().client) == 0


@pytest.mark.django_db
def test_old_finished_rows_are_pruned_after_the_retention():
    now = timezone.now()
    old = now - dt.timedelta(hours=2)
    for job_id, status, finished in [("old-done", "completed", old), ("new-done", "completed", now),
                                     ("old-active", "active", None), ("old-fail", "failed", old)]:
        Job.objects.create(queue="default", job_id=job_id, status=status, finished_at=finished)
    # Rows of jobs found gone from Redis (the reconciliation's mark) never finish.
    for job_id, status, missing in [("lost-long-ago", "scheduled", old),
                                    ("lost-lately", "active", now)]:
        Job.objects.create(queue="default", job_id=job_id, status=status, missing_at=missing)
    with override_settings(DELAYQ={**settings.DELAYQ, "MIRROR_RETENTION": 3600}):
        assert Mirror(block=0.1).prune() == 3
    assert set(Job.objects.values_list("job_id", flat=True)) == {"new-done", "old-active",
                                                                 "lost-lately"}
    with override_settings(DELAYQ={**settings.DELAYQ, "MIRROR_RETENTION": None}):
        assert Mirror(block=0.1).prune() == 0


@pytest.mark.slow
def test_runworker_mirrors_in_a_process_unless_told_not_to(tmp_path):
    env = worker_env(DELAYQ_TEST_SQLITE=str(tmp_path / "worker.sqlite3"))
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT, env=env,
                   check=True)

    def statuses() -> dict[str, str]:
        return sqlite_rows(env["DELAYQ_TEST_SQLITE"])

    first = tasks.record.enqueue("no-mirror")
    subprocess.run([sys.executable, "-m", "django", "runworker", "--burst", "--no-mirror"],
                   cwd=ROOT, env=env, check=True, capture_output=True, timeout=60)
    assert first.refresh().status == "completed"
    assert statuses() == {}
    second = tasks.record.enqueue("mirrored")
    run = subprocess.run([sys.executable, "-m", "django", "runworker", "--burst"], cwd=ROOT,
                         env=env, check=True, capture_output=True, text=True, timeout=120)
    assert statuses() == {first.id: "completed", second.id: "completed"}, run.stderr


# -- a mirror process killed mid-batch ---------------------------------------------------

@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_mirror_killed_mid_batch_loses_and_doubles_nothing(broker, redis_client, tmp_path):
    env = worker_env(DJANGO_SETTINGS_MODULE=settings.SETTINGS_MODULE)
    if connection.vendor == "sqlite":
        env["DELAYQ_TEST_SQLITE"] = str(tmp_path / "mirror.sqlite3")
        subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT, env=env,
                       check=True)

        def rows() -> list[tuple[str, str]]:
            return sqlite_query(env["DELAYQ_TEST_SQLITE"],
                                "SELECT job_id, status FROM django_delayq_job")
    else:
        env["DELAYQ_TEST_PG_NAME"] = connection.settings_dict["NAME"]

        def rows() -> list[tuple[str, str]]:
            return list(Job.objects.values_list("job_id", "status"))

    from django_delayq.engine import EnqueueRequest

    total = 3000
    requests = [EnqueueRequest(task=tasks.record.name, args=[i], job_id=f"k{i}",
                               delay=3600 if i % 3 else None) for i in range(total)]
    # Chunks of 10: entries naming 10 jobs each, so the first batch read covers only part.
    broker.enqueue_many("default", requests, chunk_size=10)
    for i in range(0, total, 7):
        EngineJob.fetch(f"k{i}", "default").cancel()
    events = len(redis_client.xrange(KEYS.events))

    # A mirror that waits between its database commit and its ack (tests/slow_ack_mirror.py)
    proc = subprocess.Popen([sys.executable, "-m", "tests.slow_ack_mirror"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = OutputReader(proc)
    try:
        out.wait_for("pausing before ack", timeout=60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert pending(redis_client) > 0, "the kill should leave a written, unacknowledged batch"
    assert 0 < len(rows()) < total

    done = subprocess.run([sys.executable, "-m", "django", "delayq_mirror", "--burst",
                           "--claim-idle", "0", "--name", "heir"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    found = rows()
    assert len(found) == len({job_id for job_id, _ in found}) == total
    expected = {f"k{i}": EngineJob.fetch(f"k{i}", "default").status for i in range(total)}
    assert dict(found) == expected
    assert pending(redis_client) == 0
    group = redis_client.xinfo_groups(KEYS.events)[0]
    assert group["last-delivered-id"] == redis_client.xrevrange(KEYS.events, count=1)[0][0]
    assert events == len(redis_client.xrange(KEYS.events))


# -- the same tests on PostgreSQL --------------------------------------------------------

@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(960)  # a whole test file in a pytest of its own: minutes when busy
def test_mirror_tests_pass_on_postgresql():
    rerun_on_postgresql("tests/test_mirror.py", this_test="test_mirror_tests_pass_on_postgresql",
                        timeout=600)


@pytest.mark.django_db
def test_the_mirror_shows_claimed_active_and_each_attempt(redis_client):
    jobs = [tasks.gated.enqueue(f"m{i}", gate="gate:mirror") for i in range(3)]
    failing = tasks.always_fails.enqueue("mirrored")
    with worker_thread(queues=["default"], concurrency=1, prefetch=2) as worker:
        wait_until(lambda: sorted(j.refresh().status for j in jobs)
                   == ["active", "claimed", "claimed"], message="one started, two buffered")
        mirror_all()
        rows = {row.job_id: row for row in Job.objects.filter(job_id__in=[j.id for j in jobs])}
        assert sorted(r.status for r in rows.values()) == ["active", "claimed", "claimed"]
        for row in rows.values():
            assert (row.started_at is None) == (row.status == "claimed")
        redis_client.set("gate:mirror", 1)
        wait_until(lambda: all(j.refresh().status == "completed" for j in jobs)
                   and failing.refresh().status == "failed", timeout=30, message="all done")
    mirror_all()
    row = Job.objects.get(job_id=failing.id)
    assert [(e["n"], e["w"], e["o"]) for e in row.attempt_log] == [
        (1, worker.name, "retried"), (2, worker.name, "retried"), (3, worker.name, "failed")]
    for job in jobs:
        [entry] = Job.objects.get(job_id=job.id).attempt_log
        assert (entry["n"], entry["w"], entry["o"]) == (1, worker.name, "completed")


@pytest.mark.django_db
def test_delayq_prune_deletes_by_age_and_keeps_the_newest_per_status():
    now = timezone.now()
    for i in range(30):
        Job.objects.create(queue="default" if i % 3 else "other", job_id=f"done-{i}",
                           status="completed", finished_at=now - dt.timedelta(minutes=i))
        Job.objects.create(queue="default", job_id=f"fail-{i}", status="failed",
                           finished_at=now - dt.timedelta(minutes=i))
    Job.objects.create(queue="default", job_id="old-ready", status="ready",
                       updated_at=now - dt.timedelta(days=90))
    out = io.StringIO()
    # By age: failed and completed rows finished more than 20 minutes ago (9 of each).
    call_command("delayq_prune", "--older-than", "1230", stdout=out)
    assert out.getvalue().strip() == "Deleted 18 rows (completed 9, failed 9)."
    # Keep the newest 5 completed rows; failed ones are left alone.
    call_command("delayq_prune", "--keep", "completed=5", stdout=out)
    done = Job.objects.filter(status="completed").order_by("finished_at")
    assert [row.job_id for row in done] == [f"done-{i}" for i in (4, 3, 2, 1, 0)]
    assert Job.objects.filter(status="failed").count() == 21
    # One queue only; rows of jobs still to run are never pruned.
    call_command("delayq_prune", "--keep", "failed=0", "--queue", "other", stdout=out)
    assert Job.objects.filter(status="failed").count() == 21
    call_command("delayq_prune", "--keep", "failed=0", "--older-than", "0", stdout=out)
    assert set(Job.objects.values_list("job_id", flat=True)) == {"old-ready"}
    with pytest.raises(CommandError, match="STATUS=N"):
        call_command("delayq_prune", "--keep", "ready=3")


@pytest.mark.parametrize(("fields", "expected"), [
    ({"manual": "1", "max_attempts": "6"}, (3, 6)),  # this version: the count goes on
    ({"manual": "1"}, (0, 3)),  # 0.1.0's retry started the count again
])
def test_a_manual_retry_event_alone_keeps_the_attempts_its_version_kept(fields, expected):
    """A row whose job hash is gone follows the events alone; during a rolling upgrade
    a retry's event may come from either version."""
    from django_delayq.mirror.events import apply_event
    from django_delayq.runtime.consumer import parse_entry

    row: dict[str, Any] = {"status": "failed", "attempts": 3, "max_attempts": 3,
                           "run_at": None, "finished_at": None, "error": "E: x",
                           "traceback": "tb"}
    entry = {"event": "retried", "job": "j", "ts": "1795000000000", "run_at": "1795000000000",
             **fields}
    (event,) = parse_entry(KEYS, "1795000000000-0", entry)
    apply_event(row, event)
    assert (row["attempts"], row["max_attempts"]) == expected
    assert (row["status"], row["error"], row["traceback"]) == ("ready", "", "")
