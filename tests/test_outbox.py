"""The transactional outbox: a job exists if and only if its transaction commits.

Every test here also runs on PostgreSQL (``test_outbox_tests_pass_on_postgresql``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.db import connection, transaction
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from django_delayq import Job as EngineJob
from django_delayq import JobNotFound, PayloadTooLarge, Queue
from django_delayq.connection import get_broker
from django_delayq.models import OutboxEntry
from django_delayq.outbox import OUTBOX, OutboxJob, Relay
from django_delayq.task import registry
from django_delayq.testing import RedisServer
from tests.conftest import (
    ROOT,
    OutputReader,
    kill_with_children,
    rerun_on_postgresql,
    sqlite_query,
    system_checks,
    wait_until,
    worker_env,
    worker_thread,
)
from tests.testapp import tasks
from tests.testapp.keyed_tasks import PEAK, RUNS, digest, per_tenant

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "admin:django_delayq_outboxentry_changelist"


def new_relay(**options: Any) -> Relay:
    """A relay as the commands build it: rows naming a task unknown here are parked."""
    return Relay(known_tasks=registry, **options)


def outbox_settings(**options: Any) -> Any:
    return override_settings(DELAYQ={**settings.DELAYQ, "OUTBOX": options})


def job_keys(client: Any) -> list[str]:
    return sorted(k for k in client.keys("{dq:*}:j:*"))


def counted(client: Any) -> dict[str, int]:
    return {k: int(v) for k, v in client.hgetall("test:count").items()}


def run_jobs(*queues: str, until: Callable[[], Any]) -> None:
    with worker_thread(queues=list(queues) or ["default"]):
        wait_until(until, message="the jobs to run")


def add_row(**fields: Any) -> OutboxEntry:
    """A row as an older deploy (or a damaged database) could have left it."""
    values: dict[str, Any] = {"job_id": f"row-{OutboxEntry.objects.count()}", "queue": "default",
                              "task_name": tasks.count_run.name, "args": '["x"]'}
    values.update(fields)
    return OutboxEntry.objects.create(**values)


# -- writing in the transaction ----------------------------------------------------------

def test_a_rollback_leaves_no_row_and_no_job(redis_client):
    with transaction.atomic():
        job = tasks.record.enqueue_in_transaction("rolled back")
        assert OutboxEntry.objects.filter(job_id=job.id).exists()
        transaction.set_rollback(True)
    assert OutboxEntry.objects.count() == 0
    assert job_keys(redis_client) == []
    with pytest.raises(JobNotFound):
        job.refresh()


def test_a_rolled_back_savepoint_drops_its_job_only(redis_client):
    with transaction.atomic():
        kept = tasks.record.enqueue_in_transaction("outer")
        try:
            with transaction.atomic():
                dropped = tasks.record.enqueue_in_transaction("inner")
                raise RuntimeError("roll back the savepoint")
        except RuntimeError:
            pass
        later = tasks.record.enqueue_in_transaction("after")
    assert OutboxEntry.objects.count() == 0
    assert kept.refresh().status == later.refresh().status == "ready"
    with pytest.raises(JobNotFound):
        dropped.refresh()
    assert len(job_keys(redis_client)) == 2


def test_the_commit_sends_the_job_at_once_as_enqueue_would(redis_client):
    run_at = timezone.now() + dt.timedelta(hours=1)
    with transaction.atomic():
        job = tasks.record.using(priority=7, max_attempts=4, run_at=run_at).enqueue_in_transaction(
            "t", extra={"b": 1, "a": [dt.date(2026, 1, 2)]})
        assert isinstance(job, OutboxJob)
        assert job.status == OUTBOX
        assert job.refresh().status == OUTBOX  # in the outbox, not yet in Redis
        assert job_keys(redis_client) == []
    assert OutboxEntry.objects.count() == 0
    direct = tasks.record.using(priority=7, max_attempts=4, run_at=run_at).enqueue(
        "t", extra={"b": 1, "a": [dt.date(2026, 1, 2)]})
    sent, expected = EngineJob.fetch(job.id), EngineJob.fetch(direct.id)
    assert (sent.status, sent.task_name, sent.args, sent.kwargs, sent.priority,
            sent.max_attempts, sent.run_at) == (
        expected.status, expected.task_name, expected.args, expected.kwargs,
        expected.priority, expected.max_attempts, expected.run_at)
    stored = redis_client.hget(f"{{dq:default}}:j:{job.id}", "k")
    assert stored == redis_client.hget(f"{{dq:default}}:j:{direct.id}", "k")
    assert stored == '{"extra":{"b":1,"a":["2026-01-02"]}}'  # key order kept


def test_bad_input_is_refused_before_anything_is_written():
    with transaction.atomic():
        with pytest.raises(TypeError, match="not JSON serializable"):
            tasks.record.enqueue_in_transaction(object())
        with pytest.raises(TypeError, match="record"):
            tasks.record.enqueue_in_transaction("a", "b", "c")
        with pytest.raises(ValueError, match="invalid job id"):
            tasks.record.using(job_id="bad id!").enqueue_in_transaction("a")
        with pytest.raises(ValueError, match="naive"):
            tasks.record.using(run_at=dt.datetime(2030, 1, 1)).enqueue_in_transaction("a")
        with override_settings(DELAYQ={**settings.DELAYQ, "MAX_PAYLOAD_BYTES": 100}), \
                pytest.raises(PayloadTooLarge):
            tasks.record.enqueue_in_transaction("x" * 200)
        assert OutboxEntry.objects.count() == 0


def test_the_job_id_is_assigned_at_once_and_a_given_id_dedupes(redis_client):
    with transaction.atomic():
        first = tasks.count_run.using(job_id="order-42").enqueue_in_transaction("a")
        second = tasks.count_run.using(job_id="order-42").enqueue_in_transaction("a")
        anonymous = tasks.count_run.enqueue_in_transaction("b")
        assert first.id == second.id == "order-42"
        assert len(anonymous.id) == 16
    assert job_keys(redis_client) == sorted(
        f"{{dq:default}}:j:{i}" for i in ("order-42", anonymous.id))


def test_a_time_limit_travels_with_the_row_on_both_paths(broker):
    with transaction.atomic():
        fast = tasks.record.using(timeout=7.5).enqueue_in_transaction("fast")
    assert EngineJob.fetch(fast.id, "default").timeout == 7.5
    with outbox_settings(FAST_PATH=False):
        with transaction.atomic():
            relayed = tasks.record.using(timeout=2).enqueue_in_transaction("relayed")
        assert OutboxEntry.objects.get(job_id=relayed.id).timeout == 2.0
        Relay(known_tasks=registry).run(burst=True)
    assert EngineJob.fetch(relayed.id, "default").timeout == 2.0


def test_outside_a_transaction_the_row_commits_and_is_sent_at_once(redis_client):
    assert not connection.in_atomic_block
    job = tasks.record.enqueue_in_transaction("autocommit")
    assert job.refresh().status == "ready"
    assert OutboxEntry.objects.count() == 0


def test_a_delay_is_fixed_at_the_call_and_a_job_due_before_the_relay_starts_at_once(broker):
    with outbox_settings(FAST_PATH=False):
        before = timezone.now()
        with transaction.atomic():
            soon = tasks.record.using(delay=0.05).enqueue_in_transaction("soon")
            later = tasks.record.using(delay=3600).enqueue_in_transaction("later")
        after = timezone.now()
        rows = {row.job_id: row for row in OutboxEntry.objects.all()}
        assert before + dt.timedelta(seconds=3600) <= rows[later.id].run_at <= (
            after + dt.timedelta(seconds=3600, milliseconds=1))
        assert soon.run_at == rows[soon.id].run_at
        due_ms = rows[soon.id].run_at.timestamp() * 1000
        wait_until(lambda: broker.server_time_ms() > due_ms + 50, message="the job to be due")
        assert new_relay().run(burst=True) == 2
    assert EngineJob.fetch(soon.id).status == "ready"  # due already: ready, not scheduled
    relayed = EngineJob.fetch(later.id)
    assert relayed.status == "scheduled"
    assert relayed.run_at == rows[later.id].run_at  # the call's time, not the relay's


@pytest.mark.parametrize("zone", [None, "Asia/Tokyo"], ids=["default-zone", "user-zone"])
def test_due_times_survive_a_project_without_time_zones(broker, zone):
    """With USE_TZ off a row keeps a naive time in TIME_ZONE, whatever zone the request
    that wrote it had activated (the relay reads it in TIME_ZONE)."""
    with outbox_settings(FAST_PATH=False), override_settings(USE_TZ=False, TIME_ZONE="UTC"):
        with timezone.override(zone or "UTC"), transaction.atomic():
            job = tasks.record.using(delay=3600).enqueue_in_transaction("naive db")
        assert timezone.is_naive(OutboxEntry.objects.get().run_at)
        assert new_relay().run(burst=True) == 1
    relayed = EngineJob.fetch(job.id)
    assert relayed.status == "scheduled"
    assert relayed.run_at == job.run_at


@pytest.mark.parametrize("fast_path", [True, False], ids=["at-commit", "relayed"])
def test_concurrency_keys_travel_with_the_row_on_both_paths(redis_client, fast_path):
    with outbox_settings(FAST_PATH=fast_path), transaction.atomic():
        jobs = [per_tenant.enqueue_in_transaction(f"{tenant}:{i}", 0.01)
                for i in range(40) for tenant in "ABC"]
    assert {(job.status, job.outcome) for job in jobs} == {(OUTBOX, OUTBOX)}
    assert [job.concurrency_key for job in jobs[:3]] == ["A", "B", "C"]
    if not fast_path:
        assert new_relay().run(burst=True) == 120
    assert OutboxEntry.objects.count() == 0
    assert EngineJob.fetch(jobs[1].id).concurrency_key == "B"
    with worker_thread(queues=["default"], concurrency=8):
        wait_until(lambda: redis_client.llen(RUNS) == 120, message="every keyed job to run")
    peaks = {key: int(peak) for key, peak in redis_client.hgetall(PEAK).items()}
    assert max(peaks[tenant] for tenant in "ABC") <= 2, peaks  # per_tenant's limit
    assert peaks["*"] > 2, peaks  # the keys ran beside each other


@pytest.mark.parametrize("fast_path", [True, False], ids=["at-commit", "relayed"])
def test_debounced_rows_make_one_job_with_the_last_arguments(redis_client, fast_path):
    debounced = digest.using(dedupe_key="digest:7", dedupe="debounce", dedupe_window=0.2)
    with outbox_settings(FAST_PATH=fast_path):
        with transaction.atomic():
            debounced.enqueue_in_transaction("digest:7", -1)
            transaction.set_rollback(True)  # never sent: nothing dedupes against it
        with transaction.atomic():
            for version in range(300):
                debounced.enqueue_in_transaction("digest:7", version)
        if not fast_path:
            relay = new_relay()
            assert relay.run(burst=True) == 300
            assert relay.added == 1
    assert OutboxEntry.objects.count() == 0
    run_jobs(until=lambda: Queue("default").counts()["completed"] == 1)
    assert [json.loads(run) for run in redis_client.lrange(RUNS, 0, -1)] == [["digest:7", 299]]
    assert sum(Queue("default").counts().values()) == 1


def test_many_rows_at_commit_are_sent_in_chunks(redis_client):
    with outbox_settings(CHUNK_SIZE=100), transaction.atomic():
        jobs = [tasks.count_run.enqueue_in_transaction(f"c{i}") for i in range(1_250)]
    assert OutboxEntry.objects.count() == 0
    assert Queue("default").counts()["ready"] == 1_250
    # one enqueue event per chunk
    assert len(redis_client.xrange("{dq:default}:events")) == 13
    assert {j.id for j in jobs} == {k.rsplit(":", 1)[1] for k in job_keys(redis_client)}


# -- Redis unreachable at commit, the relay ---------------------------------------------

@contextmanager
def own_redis() -> Iterator[RedisServer]:
    """A throwaway Redis the settings point at (stopped and started by the test)."""
    server = RedisServer().start()
    try:
        with override_settings(DELAYQ={**settings.DELAYQ, "REDIS_URL": server.url,
                                       "SOCKET_CONNECT_TIMEOUT": 1.0}):
            yield server
    finally:
        server.cleanup()


def test_redis_down_at_commit_then_back_the_job_runs_once(caplog):
    with own_redis() as server:
        server.stop()
        with transaction.atomic():
            job = tasks.count_run.enqueue_in_transaction("down")
        # The commit went through, the hook failed quietly, the row waits.
        assert "Redis is unreachable at commit" in caplog.text
        (row,) = OutboxEntry.objects.all()
        assert (row.job_id, row.parked_at) == (job.id, None)
        assert job.status == OUTBOX
        relay = new_relay()
        assert relay.step().outcome.failure is not None  # still down: counted, kept
        row.refresh_from_db()
        assert (row.attempts, row.parked_at) == (1, None)
        assert "unreachable" in row.error
        server.start()
        assert relay.run(burst=True) == 1
        assert (relay.added, relay.duplicates) == (1, 0)
        assert OutboxEntry.objects.count() == 0
        client = get_broker().client
        run_jobs(until=lambda: counted(client) == {"down": 1})
        assert new_relay().run(burst=True) == 0
        assert counted(client) == {"down": 1}


def test_a_row_sent_twice_is_one_job(redis_client):
    with outbox_settings(FAST_PATH=False), transaction.atomic():
        job = tasks.count_run.enqueue_in_transaction("twice")
    (row,) = OutboxEntry.objects.all()
    assert new_relay().run(burst=True) == 1
    row.save()  # as if the relay died after Redis took the row, before deleting it
    relay = new_relay()
    assert relay.run(burst=True) == 1
    assert (relay.added, relay.duplicates) == (0, 1)
    run_jobs(until=lambda: counted(redis_client) == {"twice": 1})
    assert EngineJob.fetch(job.id).status == "completed"


def test_an_unexpected_error_does_not_end_the_relay(monkeypatch, caplog):
    from django_delayq.outbox import relay as relay_module

    real, calls = relay_module.send_rows, []

    def surprise(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a surprise")
        return real(*args, **kwargs)

    monkeypatch.setattr(relay_module, "send_rows", surprise)
    with outbox_settings(FAST_PATH=False), transaction.atomic():
        job = tasks.count_run.enqueue_in_transaction("survives")
    assert new_relay().run(burst=True) == 1
    assert "outbox relay round failed" in caplog.text
    assert EngineJob.fetch(job.id).status == "ready"


def test_relays_through_an_outage_longer_than_any_limit_park_nothing(redis_client):
    """Every ``runworker`` runs a relay: four of them failing 1,040 sends in all (more
    than rows were once allowed before being parked) park nothing, and send each row
    once when Redis is back."""
    with own_redis() as server:
        server.stop()
        with outbox_settings(FAST_PATH=False), transaction.atomic():
            for i in range(3):
                tasks.count_run.enqueue_in_transaction(f"o{i}")
        relays = [new_relay() for _ in range(4)]
        for _ in range(260):
            for relay in relays:
                assert relay.step().outcome.failure is not None
        rows = list(OutboxEntry.objects.all())
        assert [(row.parked_at, row.attempts) for row in rows] == [(None, 1_040)] * 3
        assert all("unreachable" in row.error for row in rows)
        server.start()
        assert sum(relay.run(burst=True) for relay in relays) == 3
        assert sum(relay.parked for relay in relays) == 0
        assert OutboxEntry.objects.count() == 0
        client = get_broker().client
        run_jobs(until=lambda: counted(client) == {"o0": 1, "o1": 1, "o2": 1})


@pytest.mark.parametrize("refusal", ["OOM", "READONLY", "MISCONF"])
def test_a_redis_that_cannot_write_for_now_parks_nothing(refusal):
    """Redis answers but refuses writes for now (memory full under ``noeviction``; a
    demoted primary; its last snapshot failed, a disk full): the rows wait, as through
    an outage."""
    with own_redis() as server:
        client = get_broker().client
        with outbox_settings(FAST_PATH=False), transaction.atomic():
            tasks.count_run.enqueue_in_transaction("later")
        if refusal == "OOM":
            client.config_set("maxmemory", 1)
            undo: Callable[[], Any] = lambda: client.config_set("maxmemory", 0)  # noqa: E731
        elif refusal == "MISCONF":  # a snapshot into its directory, gone, fails
            shutil.rmtree(server.dir)
            client.config_set("save", "3600 1")
            client.bgsave()
            wait_until(lambda: client.info("persistence")["rdb_last_bgsave_status"] == "err",
                       message="the snapshot to fail")
            undo = lambda: client.config_set("save", "")  # noqa: E731 (no snapshot: writes)
        else:
            other = RedisServer().start()
            client.execute_command("REPLICAOF", "127.0.0.1", other.port)
            undo = lambda: client.execute_command("REPLICAOF", "NO", "ONE")  # noqa: E731
        try:
            relay = new_relay()
            done = relay.step()
            assert done.outcome.failure is not None, done.outcome
            row = OutboxEntry.objects.get()
            assert (row.parked_at, row.attempts, relay.parked) == (None, 1, 0)
        finally:
            undo()
            if refusal == "READONLY":
                other.cleanup()
        assert relay.run(burst=True) == 1
        assert relay.parked == 0
        assert OutboxEntry.objects.count() == 0


def test_ten_thousand_rows_in_one_transaction_are_relayed_in_chunks(redis_client):
    with outbox_settings(FAST_PATH=False), transaction.atomic():
        for i in range(10_000):
            tasks.count_run.enqueue_in_transaction(f"n{i}")
    assert OutboxEntry.objects.count() == 10_000
    relay = new_relay(chunk_size=500)
    assert relay.run(burst=True) == 10_000
    assert (relay.rounds, relay.added, relay.duplicates) == (20, 10_000, 0)
    assert OutboxEntry.objects.count() == 0
    assert Queue("default").counts()["ready"] == 10_000


# -- refusals -------------------------------------------------------------------------------

def test_a_refused_row_is_parked_with_its_error_and_the_others_are_sent(redis_client):
    good = add_row(job_id="good")
    unknown = add_row(job_id="gone", task_name="shop.tasks.removed_in_the_last_deploy")
    damaged = add_row(job_id="damaged", args="[not json")
    bad_queue = add_row(job_id="bad-queue", queue="no spaces allowed")
    bad_keys = add_row(job_id="bad-keys", keyed='["A", 0, "", "", 0, 0, 0, 1]')  # limit 0
    relay = new_relay()
    assert relay.run(burst=True) == 1
    assert relay.parked == 4
    assert job_keys(redis_client) == ["{dq:default}:j:good"]
    rows = {row.job_id: row for row in OutboxEntry.objects.all()}
    assert set(rows) == {unknown.job_id, damaged.job_id, bad_queue.job_id, bad_keys.job_id}
    assert all(row.parked_at is not None and row.attempts == 0 for row in rows.values())
    assert rows["gone"].error.startswith("UnknownTask: no task named "
                                         "'shop.tasks.removed_in_the_last_deploy'")
    assert rows["damaged"].error.startswith("ValueError: the stored arguments are not JSON")
    assert "invalid queue name" in rows["bad-queue"].error
    assert rows["bad-keys"].error.startswith(
        "ValueError: the stored flow-control keys are damaged: concurrency_limit must be")
    assert new_relay().run(burst=True) == 0  # parked: never retried by itself
    assert good.pk not in rows


def test_the_redis_refusal_of_one_row_does_not_hold_back_its_chunk(redis_client):
    redis_client.set("{dq:default}:j:taken", "not a hash")  # the enqueue script fails on it
    add_row(job_id="first")
    add_row(job_id="taken")
    add_row(job_id="last")
    relay = new_relay()
    assert relay.run(burst=True) == 2
    (row,) = OutboxEntry.objects.all()
    assert row.job_id == "taken"
    assert row.parked_at is not None
    assert "WRONGTYPE" in row.error


# -- two relays, a killed process, the worker's thread ------------------------------------

@pytest.fixture
def db_env(tmp_path: Path) -> tuple[dict[str, str], Callable[[], list[tuple[str, Any]]]]:
    """Environment for processes that share this test's database, and a reader of the
    outbox rows (job id, parked_at) as those processes see them."""
    env = worker_env(DJANGO_SETTINGS_MODULE=settings.SETTINGS_MODULE)
    if connection.vendor == "sqlite":
        env["DELAYQ_TEST_SQLITE"] = str(tmp_path / "outbox.sqlite3")
        subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT, env=env,
                       check=True)

        def rows() -> list[tuple[str, Any]]:
            return sqlite_query(env["DELAYQ_TEST_SQLITE"], "SELECT job_id, parked_at FROM "
                                "django_delayq_outboxentry ORDER BY id")
    else:
        env["DELAYQ_TEST_PG_NAME"] = connection.settings_dict["NAME"]

        def rows() -> list[tuple[str, Any]]:
            return list(OutboxEntry.objects.values_list("job_id", "parked_at"))
    return env, rows


def python(env: dict[str, str], code: str, **popen: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)


def relay_process(env: dict[str, str], *args: str, hook: str = "") -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "django", "delayq_relay", *args], cwd=ROOT,
        env={**env, "DELAYQ_TEST_RELAY_HOOK": hook}, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE)


WRITE_ROWS = """
import django, sys
django.setup()
from django.db import transaction
from tests.testapp.tasks import count_run
with transaction.atomic():
    for i in range(int(sys.argv[1])):
        count_run.enqueue_in_transaction(f"r{i}")
"""


def relayed(output: str) -> tuple[int, int, int]:
    """(rows sent, new jobs, duplicates) from ``delayq_relay``'s summary line."""
    words = output.split("Relayed ", 1)[1].replace("(", " ").replace(",", " ").split()
    return int(words[0]), int(words[2]), int(words[5])


def test_two_relays_at_once_send_each_row_once(redis_client, db_env):
    env, rows = db_env
    total = 400
    env = {**env, "DELAYQ_TEST_SETTINGS": json.dumps({"OUTBOX": {"FAST_PATH": False}})}
    subprocess.run([sys.executable, "-c", WRITE_ROWS, str(total)], cwd=ROOT, env=env,
                   check=True, timeout=120)
    assert len(rows()) == total
    waiting = get_broker(socket_timeout=70).client  # its BLPOPs wait up to 60 s
    holder = relay_process(env, "--burst", "--chunk-size", "50", hook="hold:a")
    other = None
    try:
        assert waiting.blpop(["relay:held:a"], timeout=60), "the first relay never held"
        other = relay_process(env, "--burst", "--chunk-size", "50", hook="announce:b")
        if connection.vendor == "postgresql":
            # The other relay skips the 50 locked rows and sends all the others meanwhile.
            out_other, err_other = other.communicate(timeout=120)
            assert relayed(out_other) == (total - 50, total - 50, 0), out_other + err_other
        else:
            # SQLite: the other relay waits for the database's write lock, then goes on.
            assert waiting.blpop(["relay:stepping:b"], timeout=60)
        redis_client.rpush("relay:gate:a", 1)
        out_holder, err_holder = holder.communicate(timeout=120)
        if other.returncode is None:
            out_other, err_other = other.communicate(timeout=120)
    finally:
        for proc in (holder, other):
            if proc is not None and proc.poll() is None:
                proc.kill()
    assert holder.returncode == other.returncode == 0, err_holder + err_other
    sent_a, sent_b = relayed(out_holder), relayed(out_other)
    assert sent_a[0] >= 50
    assert sent_a[0] + sent_b[0] == total  # no row sent by both
    assert sent_a[2] == sent_b[2] == 0
    assert rows() == []
    run_jobs(until=lambda: sum(counted(redis_client).values()) == total)
    assert set(counted(redis_client).values()) == {1}


KILLED_AFTER_COMMIT = """
import django, sys
django.setup()
from django.db import transaction
from tests.testapp.tasks import count_run

def stop_here():
    print("committed", flush=True)
    sys.stdin.read()  # the test kills this process here, before the send hook runs

with transaction.atomic():
    transaction.on_commit(stop_here)  # runs first: hooks run in the order registered
    job = count_run.enqueue_in_transaction("killed")
    print("job", job.id, flush=True)
"""


def test_a_process_killed_between_commit_and_send_loses_nothing(redis_client, db_env,
                                                               spawned):
    env, rows = db_env
    proc = python(env, KILLED_AFTER_COMMIT, stdin=subprocess.PIPE)
    out = OutputReader(proc)
    try:
        out.wait_for("committed", timeout=60)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        if proc.stdin:
            proc.stdin.close()
    job_id = out.text.split("job ", 1)[1].split()[0]
    assert rows() == [(job_id, None)]
    assert job_keys(redis_client) == []
    # A worker started now relays the row on its thread, and runs the job once.
    worker = subprocess.Popen([sys.executable, "-m", "django", "runworker"], cwd=ROOT,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    reader = OutputReader(worker)
    try:
        wait_until(lambda: counted(redis_client) == {"killed": 1}, timeout=60,
                   message=f"the job to run:\n{reader.text}")
        # The relay deletes the row in the transaction that sent the job, which may
        # commit after a worker already ran it.
        wait_until(lambda: rows() == [], timeout=30, message="the relayed row to go")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, reader.text
    finally:
        if worker.poll() is None:
            worker.kill()
    assert "outbox relay sent rows=1 new=1 duplicates=0" in reader.text
    assert counted(redis_client) == {"killed": 1}
    assert EngineJob.fetch(job_id).status == "completed"


@pytest.mark.parametrize(("args", "workers", "mirror"), [
    ((), 1, True), (("--no-mirror",), 1, False),
    (("--processes", "2"), 2, True), (("--processes", "2", "--no-mirror"), 2, False),
])
def test_each_runworker_runs_one_relay(redis_client, db_env, args, workers, mirror):
    """The relay runs in the mirror process (a single worker's, or the pool's), or,
    without one, in runworker itself (the pool's supervisor): never one per process."""
    env, rows = db_env
    env = {**env, "DELAYQ_TEST_SETTINGS": json.dumps({"OUTBOX": {"FAST_PATH": False}})}
    subprocess.run([sys.executable, "-c", WRITE_ROWS, "3"], cwd=ROOT, env=env, check=True,
                   timeout=120)
    worker = subprocess.Popen([sys.executable, "-m", "django", "runworker", "default", *args],
                              cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    reader = OutputReader(worker)
    try:
        wait_until(lambda: counted(redis_client) == {"r0": 1, "r1": 1, "r2": 1}, timeout=60,
                   message=f"the relayed jobs to run:\n{reader.text}")
        # every process up (each would have started its relay first)
        wait_until(lambda: reader.text.count("worker started worker=") == workers
                   and ("mirror started consumer=" in reader.text) == mirror, timeout=60,
                   message=f"the processes to start:\n{reader.text}")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, reader.text
    finally:
        if worker.poll() is None:
            kill_with_children(worker)
    assert reader.text.count("outbox relay started") == 1, reader.text
    assert rows() == []


def test_the_relay_thread_can_be_turned_off(redis_client, db_env):
    env, rows = db_env
    env = {**env, "DELAYQ_TEST_SETTINGS": json.dumps({"OUTBOX": {"FAST_PATH": False,
                                                                 "RELAY": False}})}
    subprocess.run([sys.executable, "-c", WRITE_ROWS, "3"], cwd=ROOT, env=env, check=True,
                   timeout=120)
    done = subprocess.run([sys.executable, "-m", "django", "delayq_mirror", "--burst"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(rows()) == 3
    done = subprocess.run([sys.executable, "-m", "django", "delayq_relay", "--burst"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert relayed(done.stdout) == (3, 3, 0)
    assert rows() == []


def test_delayq_relay_burst_exits_1_while_redis_is_down(db_env):
    env, rows = db_env
    with RedisServer() as server:
        down = {**env, "DELAYQ_TEST_REDIS_URL": server.url,
                "DELAYQ_TEST_SETTINGS": json.dumps({"OUTBOX": {"FAST_PATH": False}})}
        subprocess.run([sys.executable, "-c", WRITE_ROWS, "2"], cwd=ROOT, env=down,
                       check=True, timeout=120)
        server.stop()
        done = subprocess.run([sys.executable, "-m", "django", "delayq_relay", "--burst"],
                              cwd=ROOT, env=down, capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Stopped on an error" in done.stderr
    assert "DelayQConnectionError" in done.stderr
    assert len(rows()) == 2


# -- the admin ----------------------------------------------------------------------------

def admin_client(*perms: str, superuser: bool = False) -> Client:
    if superuser:
        user = User.objects.create_superuser("root", password="pw")
    else:
        user = User.objects.create_user("staff", password="pw", is_staff=True)
        for codename in perms:
            user.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(user)
    return client


def act(client: Client, action: str, *rows: OutboxEntry) -> tuple[Any, list[str]]:
    response = client.post(reverse(CHANGELIST), {
        "action": action, "_selected_action": [str(r.pk) for r in rows], "post": "yes",
    }, follow=True)
    return response, [str(m) for m in get_messages(response.wsgi_request)]


def test_the_admin_shows_parked_rows_with_their_error_and_retries_them(redis_client):
    unknown = add_row(job_id="gone", task_name="<script>alert(1)</script>")
    new_relay().run(burst=True)
    stuck = add_row(job_id="stuck", parked_at=timezone.now(), attempts=1000,
                    error="DelayQConnectionError: down")
    client = admin_client(superuser=True)
    page = client.get(reverse(CHANGELIST)).content.decode()
    assert "UnknownTask: no task named" in page
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;" in page
    assert page.count("parked</strong>") == 2
    detail = client.get(reverse("admin:django_delayq_outboxentry_change",
                                args=[unknown.pk])).content.decode()
    assert "UnknownTask" in detail
    assert 'name="_save"' not in detail  # read-only

    _, notes = act(client, "retry_now", unknown, stuck)
    assert "1 job(s) sent to Redis." in notes
    assert "1 row(s) refused again and parked: see their error." in notes
    assert job_keys(redis_client) == ["{dq:default}:j:stuck"]
    assert list(OutboxEntry.objects.values_list("job_id", flat=True)) == ["gone"]

    act(client, "delete_selected", OutboxEntry.objects.get())
    assert OutboxEntry.objects.count() == 0


def test_the_admin_lists_a_waiting_row_with_its_state_and_last_error():
    waiting = add_row(job_id="waiting-1", attempts=37,
                      error="DelayQConnectionError: Redis at redis://10.0.0.9:6379/0 is "
                            "unreachable", keyed='["<b>A</b>", 2, "d", "debounce", 1500, '
                                                 '0, 0, 1]')
    add_row(job_id="parked-1", parked_at=timezone.now(), error="UnknownTask: gone")
    client = admin_client(superuser=True)

    def listed(**query: str) -> str:
        return client.get(reverse(CHANGELIST), query).content.decode()

    page = listed()
    row = page[page.index(">waiting-1<"):page.index("</tr>", page.index(">waiting-1<"))]
    assert "<td class=\"field-state\">waiting</td>" in row
    assert "<td class=\"field-attempts\">37</td>" in row
    assert "is unreachable" in row
    assert "parked</strong>" not in row
    assert ">waiting-1<" in listed(state="waiting")
    assert ">parked-1<" not in listed(state="waiting")
    assert ">waiting-1<" not in listed(state="parked")
    detail = client.get(reverse("admin:django_delayq_outboxentry_change",
                                args=[waiting.pk])).content.decode()
    assert "waiting" in detail
    assert "10.0.0.9" in detail
    assert ("concurrency key &lt;b&gt;A&lt;/b&gt; (limit 2); dedupe key d (debounce, "
            "window 1.5 s)") in detail


def test_the_admin_follows_the_model_permissions():
    row = add_row(job_id="p1", parked_at=timezone.now(), error="UnknownTask: x")
    assert admin_client().get(reverse(CHANGELIST)).status_code == 403
    User.objects.all().delete()
    viewer = admin_client("view_outboxentry")
    page = viewer.get(reverse(CHANGELIST))
    assert page.status_code == 200
    assert "retry_now" not in page.content.decode()
    _, notes = act(viewer, "retry_now", row)
    assert OutboxEntry.objects.get().parked_at is not None  # nothing was done
    assert not any("sent to Redis" in n for n in notes)


# -- the Django Tasks backend, settings ---------------------------------------------------

def outbox_backend() -> Any:
    tasks_setting = {"default": {**settings.TASKS["default"], "OPTIONS": {"OUTBOX": True}}}
    return override_settings(TASKS=tasks_setting)


def test_the_tasks_backend_can_write_to_the_outbox(redis_client):
    from tests.testapp import standard_tasks as st

    with outbox_backend():
        backend = st.dj_record.get_backend()
        with transaction.atomic():
            st.dj_record.enqueue("rolled back")
            transaction.set_rollback(True)
        assert job_keys(redis_client) == []
        with outbox_settings(FAST_PATH=False), transaction.atomic():
            result = st.dj_record.enqueue("kept")
        assert str(result.status) in ("READY", "TaskResultStatus.READY")
        waiting = backend.get_result(result.id)
        assert str(waiting.status) == str(result.status)
        assert waiting.args == ["kept"]
        assert waiting.enqueued_at is not None
        assert new_relay().run(burst=True) == 1
        assert backend.get_result(result.id).id == result.id
        queue, job_id = result.id.split(":")
        assert EngineJob.fetch(job_id, queue).status == "ready"


def test_a_parked_row_reads_as_a_failed_task_with_its_refusal(redis_client):
    """A row the relay parked runs only if an operator sends it again: its result says
    FAILED with what refused it, not READY for ever."""
    from django_delayq.engine.errors import UnknownTask
    from tests.testapp import standard_tasks as st

    with outbox_backend():
        backend = st.dj_record.get_backend()
        with outbox_settings(FAST_PATH=False), transaction.atomic():
            result = st.dj_record.enqueue("refused")
        Relay(known_tasks={"tests.not_this_task"}).run(burst=True)
        assert OutboxEntry.objects.get().parked_at is not None
        parked = backend.get_result(result.id)
    assert str(parked.status).endswith("FAILED")
    [error] = parked.errors
    assert error.exception_class is UnknownTask
    assert "no task named" in error.traceback
    assert parked.enqueued_at is not None
    assert parked.finished_at is not None


def test_bad_outbox_settings_fail_the_checks():
    bad = {"RELAY": "yes", "CHUNK_SIZE": 0, "POLL_INTERVAL": -1, "DATABASES": ["nope"],
           "TYPO": 1}
    with override_settings(DELAYQ={**settings.DELAYQ, "OUTBOX": bad}):
        messages = [m.msg for m in system_checks() if m.id == "django_delayq.E090"]
    assert len(messages) == 5, messages
    assert any("unknown keys: TYPO" in m for m in messages)
    with override_settings(DELAYQ={**settings.DELAYQ, "OUTBOX": {"CHUNK_SIZE": 10}}):
        assert [m for m in system_checks() if m.id == "django_delayq.E090"] == []


# -- the same tests on PostgreSQL --------------------------------------------------------

@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.timeout(960)  # a whole test file in a pytest of its own: minutes when busy
def test_outbox_tests_pass_on_postgresql():
    rerun_on_postgresql("tests/test_outbox.py", this_test="test_outbox_tests_pass_on_postgresql",
                        timeout=900)
