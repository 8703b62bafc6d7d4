"""How the mirror writes rows (``django_delayq/mirror/table.py``): each carries the stream
position its state is as of, and a write of an older position never replaces a newer
one, whatever the order in which mirrors and ``refresh_rows`` write.

Every test here also runs on PostgreSQL (``test_mirror_table_tests_pass_on_postgresql``).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from django_delayq import Job as EngineJob
from django_delayq import Queue
from django_delayq.connection import engine_config, get_broker
from django_delayq.engine import Broker, EnqueueRequest
from django_delayq.engine.errors import InvalidJobState
from django_delayq.engine.keys import QueueKeys
from django_delayq.mirror import GROUP, Mirror, table
from django_delayq.mirror.consumer import refresh_rows
from django_delayq.mirror.events import row_from_hash
from django_delayq.models import Job
from django_delayq.runtime.consumer import stream_id
from tests.conftest import rerun_on_postgresql, wait_until, worker_thread
from tests.testapp import tasks

KEYS = QueueKeys("dq", "default")


def mirror_all(**kwargs: Any) -> Mirror:
    mirror = Mirror(block=0.1, **kwargs)
    mirror.run(burst=True, timeout=60)
    return mirror


def snapshot() -> dict[str, tuple[Any, ...]]:
    return {row.job_id: (row.status, row.attempts, row.args, row.kwargs, row.result,
                         row.attempt_log, row.started_at, row.finished_at, row.last_event_id,
                         row.last_event_ms, row.last_event_seq, row.updated_at)
            for row in Job.objects.all()}


def hash_reads(client: Any) -> int:
    """Job hashes Redis has read: HGETALLs, in a transaction or a script (``read_jobs``)."""
    return int(client.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0))


def stale_row(job_id: str) -> table.Row:
    """The row a mirror would write from the job's hash as it is now."""
    position, (data,) = get_broker().commands.read_jobs(KEYS, [job_id])
    assert isinstance(data, dict)
    row = row_from_hash("default", job_id, data)
    row.update(table.position_fields(stream_id(position), timezone.now()))
    return row


def test_read_jobs_answers_the_hashes_and_the_newest_entry_of_their_stream(broker,
                                                                          redis_client):
    assert broker.commands.read_jobs(KEYS, ["none"]) == ("", [{}])  # no stream yet
    job = tasks.record.using(delay=3600).enqueue("read")
    redis_client.set(KEYS.job("a-string"), "x")
    (newest, _), = redis_client.xrevrange(KEYS.events, count=1)
    position, found = broker.commands.read_jobs(KEYS, [job.id, "none", "a-string"])
    assert position == newest
    assert found == [redis_client.hgetall(KEYS.job(job.id)), {}, "string"]


@pytest.mark.django_db
def test_a_batch_applied_twice_changes_nothing_and_reads_no_hash(redis_client):
    jobs = [tasks.record.enqueue(f"twice{i}") for i in range(4)]
    cancelled = tasks.record.using(delay=3600).enqueue("cancelled")
    cancelled.cancel()
    with worker_thread(queues=["default"]):
        wait_until(lambda: all(j.refresh().status == "completed" for j in jobs),
                   message="jobs to complete")
    entries = redis_client.xrange(KEYS.events)
    mirror = Mirror(block=0.1)
    mirror.apply(KEYS, entries)
    before = snapshot()
    assert {v[0] for v in before.values()} == {"completed", "cancelled"}
    reads = hash_reads(redis_client)
    Mirror(block=0.1).apply(KEYS, entries)
    assert snapshot() == before
    assert hash_reads(redis_client) == reads  # every row already held every event


@pytest.mark.django_db
def test_a_write_as_of_an_older_position_never_replaces_a_newer_row(redis_client):
    job = tasks.record.using(delay=3600).enqueue("x")
    older = stale_row(job.id)  # read before the cancel, written after it
    job.cancel()
    mirror_all()
    newer = Job.objects.get(job_id=job.id)
    assert newer.status == "cancelled"
    table.upsert([older])
    assert snapshot()[job.id] == (newer.status, newer.attempts, newer.args, newer.kwargs,
                                  newer.result, newer.attempt_log, newer.started_at,
                                  newer.finished_at, newer.last_event_id, newer.last_event_ms,
                                  newer.last_event_seq, newer.updated_at)
    # The same position again changes nothing either; a newer one does.
    same = stale_row(job.id)
    same.update(table.position_fields((newer.last_event_ms, newer.last_event_seq),
                                      timezone.now()))
    same["status"] = "ready"
    table.upsert([same])
    assert Job.objects.get(job_id=job.id).status == "cancelled"
    same.update(table.position_fields((newer.last_event_ms, newer.last_event_seq + 1),
                                      timezone.now()))
    table.upsert([same])
    assert Job.objects.get(job_id=job.id).status == "ready"


@pytest.mark.django_db
def test_refresh_rows_shows_a_change_at_once_and_its_events_then_change_nothing(redis_client):
    job = tasks.record.using(delay=3600).enqueue("refresh")
    older = stale_row(job.id)
    mirror_all()
    job.cancel()
    assert refresh_rows("default", [job.id]) == 1
    row = Job.objects.get(job_id=job.id)
    assert row.status == "cancelled"
    refreshed = snapshot()
    table.upsert([older])  # a mirror that read the hash before the cancel writes late
    reads = hash_reads(redis_client)
    mirror_all()  # the cancelled event: already in the row
    assert snapshot() == refreshed
    assert hash_reads(redis_client) == reads
    assert refresh_rows("default", ["no-such-job"]) == 0


@pytest.mark.django_db(transaction=True)
def test_a_mirror_that_read_a_hash_before_another_wrote_a_newer_one_leaves_the_newer(
        broker, redis_client):
    job = tasks.record.using(delay=3600).enqueue("slow")
    (first, *_) = redis_client.xrange(KEYS.events)
    read, go = threading.Event(), threading.Event()
    slow_broker = Broker(broker.client, engine_config())
    read_jobs = slow_broker.commands.read_jobs

    def read_then_wait(keys: QueueKeys, job_ids: Any) -> Any:
        found = read_jobs(keys, job_ids)
        read.set()
        assert go.wait(30), "the other mirror never wrote"
        return found

    slow_broker.commands.read_jobs = read_then_wait  # type: ignore[method-assign]
    slow = Mirror(broker=slow_broker, block=0.1, name="slow")

    def apply() -> None:
        try:
            slow.apply(KEYS, [first])  # the enqueued event: reads the hash, then waits
        finally:
            connections.close_all()

    thread = threading.Thread(target=apply, daemon=True)
    thread.start()
    try:
        assert read.wait(30), "the slow mirror never read the hash"
        job.cancel()
        mirror_all(name="fast")  # reads the hash after the cancel and writes it first
        fast = Job.objects.get(job_id=job.id)
        assert fast.status == "cancelled"
    finally:
        go.set()
        thread.join(30)
    assert not thread.is_alive()
    row = Job.objects.get(job_id=job.id)
    assert (row.status, row.last_event_id, row.updated_at) == (
        "cancelled", fast.last_event_id, fast.updated_at)


@pytest.mark.django_db(transaction=True)
def test_mirrors_sharing_a_stream_while_a_worker_runs_leave_every_row_as_redis_has_it(
        broker, redis_client):
    total = 300
    broker.enqueue_many("default", [
        EnqueueRequest(task=tasks.record.name, args=[i], job_id=f"race{i}",
                       delay=3600 if i % 4 == 0 else None) for i in range(total)])
    # Each mirror also takes the other's pending entries at once (claim_idle 0): both
    # write the same jobs, from hashes read at different moments.
    mirrors = [Mirror(block=0.05, claim_idle=0, name=f"racer{i}") for i in range(2)]

    def run(mirror: Mirror) -> None:
        try:
            mirror.run()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run, args=(m,), daemon=True) for m in mirrors]
    for thread in threads:
        thread.start()
    try:
        with worker_thread(queues=["default"], concurrency=4):
            for i in range(total):  # the delayed ones, and others if not started yet
                if i % 4 == 0 or i % 8 == 1:
                    with contextlib.suppress(InvalidJobState):
                        EngineJob.fetch(f"race{i}", "default").cancel()
            wait_until(lambda: sum(Queue("default").counts()[s] for s in
                                   ("completed", "cancelled")) == total, timeout=60,
                       message="every job to end")
    finally:
        for mirror in mirrors:
            mirror.request_stop()
        for thread in threads:
            thread.join(30)
    assert not any(thread.is_alive() for thread in threads)
    for mirror in mirrors:  # both done: what is left pending
        mirror.drain(timeout=60)
    assert int(redis_client.xpending(KEYS.events, GROUP)["pending"]) == 0
    rows = {row.job_id: row for row in Job.objects.all()}
    assert len(rows) == total
    for i in range(total):
        live = EngineJob.fetch(f"race{i}", "default")
        row = rows[f"race{i}"]
        assert (row.status, row.attempts, row.started_at, row.finished_at) == (
            live.status, live.attempts, live.started_at, live.finished_at), row.job_id


@pytest.mark.django_db
def test_a_job_key_that_is_not_a_hash_is_skipped_alone_and_recorded(redis_client):
    good = tasks.record.using(delay=3600).enqueue("good")
    bad = tasks.record.using(delay=3600).enqueue("bad")
    redis_client.delete(KEYS.job(bad.id))
    redis_client.set(KEYS.job(bad.id), "not a hash")
    mirror = mirror_all()
    assert list(Job.objects.values_list("job_id", flat=True)) == [good.id]
    assert mirror.skipped == 1
    count, reasons = Queue("default").skipped_events()
    assert count == 1
    assert f"job {bad.id}: ValueError: its key holds a string, not a job hash" in reasons[0]
    assert int(redis_client.xpending(KEYS.events, GROUP)["pending"]) == 0


@pytest.mark.django_db
def test_json_fields_read_back_as_the_job_holds_them(redis_client):
    values = [
        ([1, "two", {"3": [4.5, None, True]}], {"k": "v"}),
        (["é ü 日本", "\U0001F600"], {"nested": {"deep": [[], {}]}}),
        ([10**30, -0.0, 1e-300], {}),
        (["nul\x00inside", "lone\ud800surrogate"], {"k\x00": "v"}),
    ]
    broker = get_broker()
    jobs = [broker.enqueue("default", tasks.record.name, args, kwargs, delay=3600).job_id
            for args, kwargs in values]
    mirror_all()
    for job_id, (args, kwargs) in zip(jobs, values, strict=True):
        row = Job.objects.get(job_id=job_id)
        if "nul\x00inside" in args:  # what no database stores: U+FFFD in its place
            assert row.args == ["nul\ufffdinside", "lone\ufffdsurrogate"]
            assert row.kwargs == {"k\ufffd": "v"}
        else:
            assert (row.args, row.kwargs) == (args, kwargs)
        assert row.result is None  # no result yet: SQL NULL, not JSON null
    assert Job.objects.filter(result__isnull=True).count() == len(jobs)


@pytest.mark.django_db
def test_the_mirror_refuses_a_database_it_cannot_write_before_anything_is_written(
        monkeypatch):
    monkeypatch.setattr(connection, "vendor", "mysql")
    with pytest.raises(ImproperlyConfigured, match="SQLite or PostgreSQL"):
        Mirror(block=0.1)


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_existing_rows_the_position_of_their_last_event():
    executor = MigrationExecutor(connection)
    graph = executor.loader.graph
    (this,) = [key for key in graph.nodes
               if key[0] == "django_delayq" and key[1].endswith("_job_last_event_position")]
    (before,) = [node.key for node in graph.node_map[this].parents
                 if node.key[0] == "django_delayq"]
    latest = graph.leaf_nodes("django_delayq")
    executor.migrate([before])
    try:
        with connection.cursor() as cursor:
            for job_id, last in [("a", "1764089000123-7"), ("b", ""), ("c", "junk-1"),
                                 ("d", "12-x")]:
                cursor.execute(
                    "INSERT INTO django_delayq_job (job_id, queue, task_name, status, "
                    "priority, args, kwargs, attempts, max_attempts, worker, error, "
                    "traceback, last_event_id, updated_at, attempt_log, progress_message, "
                    "parents) VALUES (%s, 'default', 't', 'ready', 0, '[]', '{}', 0, 1, '', "
                    "'', '', %s, %s, '[]', '', '[]')", [job_id, last, timezone.now()])
        executor = MigrationExecutor(connection)
        executor.migrate(latest)
        positions = {row.job_id: (row.last_event_ms, row.last_event_seq)
                     for row in Job.objects.all()}
        assert positions == {"a": (1764089000123, 7), "b": (0, 0), "c": (0, 0), "d": (0, 0)}
    finally:
        Job.objects.all().delete()
        MigrationExecutor(connection).migrate(latest)


@pytest.mark.django_db
def test_rows_are_locked_in_the_order_writes_take_whatever_the_databases_collation():
    """Mirrors sharing a stream write overlapping rows at once: each transaction must lock
    them in one order or two can deadlock. The inserts take their locks in Python's order
    (code points); so must the locking read, also where the database's collation sorts
    otherwise (run on PostgreSQL with an ICU English collation, as en_US databases do)."""
    ids = ["a", "B", "_c", "-d", "Z", "\u00e9", "e", "A1", "a1"]
    if connection.vendor == "postgresql":
        column = Job._meta.get_field("job_id")
        with connection.cursor() as cursor:
            cursor.execute("SELECT collname FROM pg_collation WHERE collname = 'en-US-x-icu'")
            if cursor.fetchone() is None:
                pytest.fail("this PostgreSQL has no ICU collations (en-US-x-icu): the test "
                            "needs a server built with ICU, as Debian's and the official are")
            cursor.execute(f'ALTER TABLE "{Job._meta.db_table}" ALTER COLUMN "job_id" TYPE '
                           f'{column.db_type(connection)} COLLATE "en-US-x-icu"')
        table.lock_rows("default", ids, timezone.now())
        by_collation = list(Job.objects.filter(job_id__in=ids).order_by("job_id")
                            .values_list("job_id", flat=True))
        assert by_collation != sorted(ids)  # the collation took: it sorts otherwise
    with transaction.atomic():
        locked = table.lock_rows("default", ids, timezone.now())
    assert list(locked) == sorted(ids)


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(960)  # a whole test file in a pytest of its own: minutes when busy
def test_mirror_table_tests_pass_on_postgresql():
    rerun_on_postgresql("tests/test_mirror_table.py",
                        this_test="test_mirror_table_tests_pass_on_postgresql", timeout=600)
