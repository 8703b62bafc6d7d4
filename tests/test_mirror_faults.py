"""Faults under the model mirror, in real processes: the database goes away while
``manage.py delayq_mirror`` runs, and Redis crashes under it. Events wait, then land."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_delayq.connection import get_broker
from django_delayq.engine import EnqueueRequest
from django_delayq.mirror import GROUP
from django_delayq.runtime.worker.fetcher import MAX_PREFETCH
from tests import services
from tests.conftest import (
    ROOT,
    OutputReader,
    child_pids,
    kill_with_children,
    sqlite_rows,
    wait_until,
    worker_env,
)
from tests.test_faults import held_by
from tests.testapp.fault_tasks import count_run

CONCURRENCY = 4


def admin_connection() -> Any:
    import psycopg

    try:
        return psycopg.connect(services.pg_admin_dsn(), autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {services.pg_where()} (trust auth): "
                    f"unset DELAYQ_TEST_PG_URL to let the suite start its own: {exc}")


@pytest.fixture
def pg_database() -> Iterator[tuple[Any, str]]:
    """A PostgreSQL database of its own, migrated, dropped at the end."""
    admin = admin_connection()
    name = f"delayq_fault_{os.getpid()}"
    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT,
                       env=pg_env(name), check=True, timeout=120)
        yield admin, name
    finally:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def pg_env(name: str) -> dict[str, str]:
    return worker_env(DJANGO_SETTINGS_MODULE="tests.settings_postgres",
                      DELAYQ_TEST_PG_NAME=name)


def rows(name: str) -> dict[str, str]:
    import psycopg

    with psycopg.connect(services.pg_admin_dsn(name),
                         connect_timeout=5) as db:
        return dict(db.execute("SELECT job_id, status FROM django_delayq_job").fetchall())


def pending(client: Any, stream: str) -> int:
    """Entries of ``stream`` read and not acknowledged (0 before any mirror made its group)."""
    try:
        return int(client.xpending(stream, GROUP)["pending"])
    except redis.ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        return 0


@pytest.mark.slow
@pytest.mark.postgres
def test_mirror_waits_out_a_database_outage_then_mirrors_every_event(redis_client, pg_database,
                                                                      fault_report):
    admin, name = pg_database
    broker = get_broker()
    keys = broker.shards("default")[0]
    first = broker.enqueue_many("default", [
        EnqueueRequest(task=count_run.name, args=[f"p{i}"], job_id=f"p{i}", delay=3600)
        for i in range(200)]).job_ids
    # Damaged entries first: they must not hold up the stream (PostgreSQL enforces
    # column lengths, so an over-long id would fail every insert of its batch).
    redis_client.xadd(keys.events, {"event": "enqueued", "job": "x" * 300, "ts": "1"})
    redis_client.xadd(keys.events, {"event": "started", "job": "odd-fields", "ts": "1",
                                    "attempt": "x" * 100, "worker": "w" * 500})
    # Strings PostgreSQL cannot store (NUL, an unpaired surrogate) are valid job data.
    broker.enqueue("default", count_run.name, ["nul\x00"], job_id="nul", delay=3600)
    broker.enqueue("default", count_run.name, ["lone\ud800"], job_id="lone", delay=3600)
    proc = subprocess.Popen([sys.executable, "-m", "django", "delayq_mirror", "--name", "pg"],
                            cwd=ROOT, env=pg_env(name), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    out = OutputReader(proc)
    try:
        wait_until(lambda: len(rows(name)) == 203, timeout=30,
                   message=f"the first rows:\n{out.text}")
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        second = broker.enqueue_many("default", [
            EnqueueRequest(task=count_run.name, args=[f"q{i}"], job_id=f"q{i}", delay=3600)
            for i in range(300)]).job_ids
        from django_delayq import Job

        for job_id in first[:50]:
            Job.fetch(job_id, "default").cancel()
        out.wait_for("cannot write to the database", timeout=30)
        assert pending(redis_client, keys.events) > 0, "read events wait, unacknowledged"
        assert proc.poll() is None, "the mirror must wait for the database, not exit"
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
        expected = (dict.fromkeys(first + second, "scheduled")
                    | dict.fromkeys(first[:50], "cancelled")
                    | {"odd-fields": "active", "nul": "scheduled", "lone": "scheduled"})
        wait_until(lambda: rows(name) == expected, timeout=30,
                   message=f"every event mirrored after the outage:\n{out.text}")
        # The rows commit before their entries are acknowledged: wait for the ack.
        wait_until(lambda: pending(redis_client, keys.events) == 0, timeout=30,
                   message=f"the entries acknowledged:\n{out.text}")
        assert proc.poll() is None
        found = rows(name)
        fault_report("database unavailable under delayq_mirror (PostgreSQL)", len(expected),
                      sum(1 for j, s in expected.items() if found.get(j) != s), 0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, out.text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
@pytest.mark.postgres
def test_workers_and_mirrors_sigkilled_every_second_leave_every_row_right(
        redis_client, pg_database, fault_report):
    import itertools
    import random
    import time

    _, name = pg_database
    broker = get_broker()
    total = 3_000
    job_ids = broker.enqueue_many("chaos", [
        EnqueueRequest(task=count_run.name, args=[f"k{i}"], job_id=f"k{i}", max_attempts=100)
        for i in range(total)]).job_ids
    env = pg_env(name)
    procs: list[subprocess.Popen[str]] = []
    serial = itertools.count()

    def start() -> tuple[subprocess.Popen[str], str]:
        worker = f"chaos-{next(serial)}"
        proc = subprocess.Popen([sys.executable, "-m", "django", "runworker", "chaos",
                                 "-c", str(CONCURRENCY), "--lease", "2", "--name", worker,
                                 "-v", "0"],
                                cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, text=True)
        procs.append(proc)
        return proc, worker

    try:
        slots = [start() for _ in range(3)]
        rng = random.Random(7)
        held_at_kills: list[set[str]] = []
        done = 0
        progressed = time.monotonic()
        keys = broker.shards("chaos")[0]
        while redis_client.hlen("test:runs") < total or redis_client.zcard(keys.active):
            time.sleep(1.0)  # the fault schedule: at most one SIGKILL a second, and only
            # once more jobs have run since the last one: on a loaded machine a worker can
            # take longer than a second to start, and killing it first tests nothing.
            if redis_client.hlen("test:runs") == done:
                assert time.monotonic() - progressed < 120, "no job ran for 120 s"
                continue
            done, progressed = redis_client.hlen("test:runs"), time.monotonic()
            slot = rng.randrange(3)
            proc, worker = slots[slot]
            # Frozen, it changes nothing: what it holds now is what it can run twice. The
            # machine dies: runworker (with its mirror) and its worker process at once.
            (child,) = wait_until(lambda proc=proc: child_pids(proc.pid),
                                  message="its worker process")
            os.kill(child, signal.SIGSTOP)
            held_at_kills.append(set(held_by(redis_client, keys, f"{worker}-0")))
            kill_with_children(proc)
            slots[slot] = start()
        for proc, _ in slots:
            proc.terminate()
        for proc, _ in slots:
            proc.wait(timeout=60)
        # The killed mirrors' unacknowledged events belong to consumers that are gone:
        # one drain takes them over at once.
        drain = subprocess.run([sys.executable, "-m", "django", "delayq_mirror", "--burst",
                                "--claim-idle", "0"], cwd=ROOT, env=env, capture_output=True,
                               text=True, timeout=120)
        assert drain.returncode == 0, drain.stdout + drain.stderr
        found = rows(name)
        wrong = [j for j in job_ids if found.get(j) != "completed"]
        runs = redis_client.hgetall("test:runs")
        duplicated = {j for j in job_ids if int(runs.get(j, 0)) > 1}
        kills = len(held_at_kills)
        fault_report(f"runworker and its mirror process SIGKILLed every 1 s ({kills} kills, "
                     "PostgreSQL)", total, len(wrong), len(duplicated))
        # A SIGKILLed worker runs again at most the jobs it held unacked: the worker counts
        # them against its room (threads plus its prefetch, which adapts to the jobs' run
        # time up to MAX_PREFETCH), so no kill can cost more.
        assert max(map(len, held_at_kills), default=0) <= CONCURRENCY + max(CONCURRENCY,
                                                                             MAX_PREFETCH)
        outside = duplicated - set().union(*held_at_kills)
        assert not outside, f"{len(outside)} jobs ran twice that no killed worker held"
        assert len(found) == total, "one row per job, none twice"
        assert not wrong, f"{len(wrong)} rows not completed, e.g. {wrong[:5]}"
        assert pending(redis_client, keys.events) == 0
    finally:
        for proc in procs:
            if proc.poll() is None:
                kill_with_children(proc)


@pytest.mark.slow
def test_worker_and_its_mirror_process_reconnect_after_a_redis_crash(tmp_path, fault_report):
    from django_delayq.engine import Broker, EngineConfig
    from django_delayq.testing import RedisServer

    db = str(tmp_path / "mirror.sqlite3")
    with RedisServer(appendonly=True) as server:
        env = worker_env(server.url, DELAYQ_TEST_SQLITE=db)
        subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT, env=env,
                       check=True, timeout=120)
        proc = subprocess.Popen([sys.executable, "-m", "django", "runworker", "chaos", "-c", "4",
                                 "--lease", "2"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        out = OutputReader(proc)
        try:
            out.wait_for("mirror started")
            broker = Broker(redis_client_for(server.url), EngineConfig())

            def enqueue(prefix: str, n: int) -> list[str]:
                return broker.enqueue_many("chaos", [
                    EnqueueRequest(task=count_run.name, args=[f"{prefix}{i}"],
                                   job_id=f"{prefix}{i}") for i in range(n)]).job_ids

            before = enqueue("m", 1000)
            wait_until(lambda: sqlite_rows(db) == dict.fromkeys(before, "completed"),
                       timeout=60, message=f"rows before the crash:\n{out.text[-3000:]}")
            server.kill()
            out.wait_for("redis unavailable", timeout=30)
            out.wait_for("mirror cannot reach Redis", timeout=30)
            server.start()
            after = enqueue("n", 500)
            expected = dict.fromkeys(before + after, "completed")
            wait_until(lambda: sqlite_rows(db) == expected, timeout=60,
                       message=f"rows after the restart:\n{out.text[-3000:]}")
            assert proc.poll() is None, "worker and mirror must reconnect on their own"
            found = sqlite_rows(db)
            fault_report("Redis SIGKILLed under runworker and its mirror process (AOF)",
                         len(expected), sum(1 for j in expected if found.get(j) != "completed"),
                         0)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0, out.text[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def redis_client_for(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url, decode_responses=True)


@pytest.mark.django_db
@pytest.mark.parametrize("fields", [
    {"event": "completed"},
    {"job": "no-event"},
    {"event": "", "job": "empty-event"},
    {"event": "completed", "job": ""},
    {"event": "completed", "job": "x" * 300},
    {"event": "completed", "job": "a b{c}"},
    {"event": "completed", "job": "bad-ts", "ts": "yesterday"},
    {"garbage": "\x00\xff"},
])
def test_garbled_events_are_skipped_and_the_stream_goes_on(redis_client, fields, caplog):
    from django_delayq.mirror import Mirror
    from django_delayq.models import Job
    from tests.testapp.tasks import record

    keys = get_broker().shards("default")[0]
    before = record.enqueue("before")
    entry = redis_client.xadd(keys.events, fields)
    after = record.enqueue("after")
    mirror = Mirror(block=0.1)
    mirror.run(burst=True, timeout=30)
    assert mirror.skipped == 1
    assert set(Job.objects.values_list("job_id", flat=True)) == {before.id, after.id}
    assert pending(redis_client, keys.events) == 0
    # one log record for the entry, with its id and why (a record per layer would be noise)
    [said] = [r for r in caplog.records if getattr(r, "id", None) == entry]
    assert said.levelname == "ERROR", said
    assert said.reason.startswith("garbled event: "), said


@pytest.mark.django_db
def test_an_unknown_event_kind_keeps_the_row_and_the_stream_goes_on(redis_client, caplog):
    from django_delayq.mirror import Mirror
    from django_delayq.models import Job
    from tests.testapp.tasks import record

    keys = get_broker().shards("default")[0]
    job = record.using(delay=3600).enqueue("kept")
    redis_client.xadd(keys.events, {"event": "exploded", "job": "ghost", "ts": "1"})
    after = record.enqueue("after")
    Mirror(block=0.1).run(burst=True, timeout=30)
    rows = dict(Job.objects.values_list("job_id", "status"))
    assert rows[job.id] == "scheduled"
    assert rows[after.id] == "ready"
    assert pending(redis_client, keys.events) == 0


@pytest.mark.django_db
def test_strings_a_database_cannot_store_are_mirrored_as_replacement_characters(redis_client):
    from django_delayq.mirror import Mirror
    from django_delayq.models import Job
    from tests.conftest import worker_thread
    from tests.testapp.tasks import always_fails, record

    nul = record.using(delay=3600).enqueue("a\x00b", extra={"k\x00": ["\ud800", 1]})
    failing = always_fails.using(max_attempts=1).enqueue("boom\x00")
    with worker_thread(queues=["default"]):
        wait_until(lambda: failing.refresh().status == "failed", message="the failure")
    Mirror(block=0.1).run(burst=True, timeout=30)
    row = Job.objects.get(job_id=nul.id)
    assert (row.args, row.kwargs) == (["a\ufffdb"], {"extra": {"k\ufffd": ["\ufffd", 1]}})
    row = Job.objects.get(job_id=failing.id)
    assert row.error == "builtins.RuntimeError: boom boom\ufffd"
    assert "\x00" not in row.traceback
    assert nul.refresh().args == ["a\x00b"], "Redis keeps the job's data as it was given"
