"""The worker, run in a thread: it runs jobs, retries, dead-letters, and keeps going."""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from django_delayq import Job, Queue
from django_delayq.engine.fields import stored
from django_delayq.engine.keys import QueueKeys
from tests.conftest import ran, wait_until, worker_thread
from tests.testapp import tasks


def test_runs_jobs_in_priority_order_and_keeps_results(redis_client):
    low = tasks.record.using(priority=-10).enqueue("low")
    high = tasks.record.using(priority=10).enqueue("high", extra={"n": 1})
    with worker_thread(queues=["default"], concurrency=1, burst=True) as worker:
        wait_until(lambda: worker.stopping, message="burst to finish")
    assert [r["tag"] for r in ran(redis_client)] == ["high", "low"]
    high.refresh()
    assert (high.status, high.result, high.attempts) == ("completed", "high", 1)
    assert high.started_at <= high.finished_at
    assert low.refresh().status == "completed"


def test_delayed_job_starts_at_its_run_at_never_before(redis_client):
    jobs = [tasks.record.using(delay=0.2 + i * 0.05).enqueue(f"d{i}") for i in range(5)]
    with worker_thread(queues=["default"]):
        wait_until(lambda: len(ran(redis_client)) == 5, message="delayed jobs")
    for job in jobs:
        job.refresh()
        assert job.started_at >= job.run_at
    notes = {r["tag"]: r["redis_ms"] for r in ran(redis_client)}
    for i, job in enumerate(jobs):
        assert notes[f"d{i}"] >= job.run_at.timestamp() * 1000


def test_failing_job_retries_with_backoff_then_dead_letters_with_traceback(redis_client):
    job = tasks.always_fails.enqueue("x")
    with worker_thread(queues=["default"]):
        wait_until(lambda: job.refresh().status == "failed", message="dead letter")
    assert job.attempts == 3
    assert job.error == "builtins.RuntimeError: boom x"
    assert "Traceback (most recent call last)" in job.traceback
    assert 'raise RuntimeError(f"boom {tag}")' in job.traceback
    times = [r["redis_ms"] for r in ran(redis_client)]
    assert len(times) == 3
    # backoff 0.2 s then 0.4 s, each jittered down to half at most
    assert times[1] - times[0] >= 100
    assert times[2] - times[1] >= 200
    events = redis_client.xrange(QueueKeys("dq", "default").events)
    kinds = [e[1]["event"] for e in events]
    assert kinds.count("retried") == 2
    assert kinds.count("failed") == 1
    assert Queue("default").counts()["failed"] == 1


def test_unknown_task_and_corrupt_payload_fail_cleanly_and_worker_goes_on(broker, redis_client):
    unknown = broker.enqueue("default", "nowhere.to_be_found", [1], max_attempts=1).job_id
    corrupt = broker.enqueue("default", tasks.record.name, ["c"], max_attempts=3).job_id
    redis_client.hset(QueueKeys("dq", "default").job(corrupt), stored("args"), "[not json")
    good = tasks.record.enqueue("after")
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: good.refresh().status == "completed", message="good job")
        wait_until(lambda: Job.fetch(corrupt).status == "failed", message="corrupt job")
    bad = Job.fetch(unknown)
    assert bad.status == "failed"
    assert "no task named 'nowhere.to_be_found' is registered" in bad.error
    broken = Job.fetch(corrupt)
    assert broken.attempts == 1, "a corrupt payload is not retried"
    assert "undecodable arguments" in broken.error


def test_result_that_is_not_json_fails_the_job(redis_client):
    job = tasks.returns_unjsonable.enqueue()
    with worker_thread(queues=["default"], burst=True) as worker:
        wait_until(lambda: worker.stopping)
    job.refresh()
    assert job.status == "failed"
    assert "not JSON serializable" in job.error


def test_worker_serves_several_queues(redis_client):
    tasks.record.enqueue("a")
    tasks.record_other.enqueue("b")
    with worker_thread(queues=["default", "other"]):
        wait_until(lambda: len(ran(redis_client)) == 2)
    assert sorted(r["tag"] for r in ran(redis_client)) == ["a", "b"]


def test_default_queues_are_those_of_registered_tasks():
    from django_delayq.worker import Worker

    assert Worker().queues == ["async", "default", "other", "soak_async", "soak_async_sync",
                               "soak_mixed", "soak_sync"]


def test_many_jobs_all_run_exactly_once_with_batched_claims(redis_client):
    tasks.record.enqueue_many([[f"n{i}"] for i in range(500)])
    with worker_thread(queues=["default"], concurrency=4, burst=True) as worker:
        wait_until(lambda: worker.stopping, timeout=60)
    tags = [r["tag"] for r in ran(redis_client)]
    assert sorted(tags) == sorted(f"n{i}" for i in range(500))
    assert Queue("default").counts()["completed"] == 500
    assert worker.processed == 500


def test_a_job_completed_at_its_first_attempt_keeps_a_compact_hash_and_its_log(redis_client):
    """Its attempt is implied by its hash (no log field), so the hash stays within
    Redis's compact encoding, which takes values of up to 64 bytes (one log entry is
    longer); every reader still shows the attempt."""
    ids = tasks.record.enqueue_many([[f"c{i}"] for i in range(300)]).job_ids
    with worker_thread(queues=["default"], concurrency=4, burst=True) as worker:
        wait_until(lambda: worker.stopping, timeout=60)
    keys = QueueKeys("dq", "default")
    assert len(ids) == 300
    for job_id in ids:
        assert redis_client.object("encoding", keys.job(job_id)) in ("listpack", "ziplist")
        job = Job.fetch(job_id, "default")
        assert [(e["attempt"], e["worker"], e["outcome"]) for e in job.attempt_log] == [
            (1, worker.name, "completed")]
        [entry] = job.attempt_log
        assert (entry["started_at"], entry["finished_at"]) == (job.started_at, job.finished_at)


def test_events_stream_records_the_lifecycle(redis_client):
    job = tasks.record.enqueue("e")
    with worker_thread(queues=["default"], burst=True) as worker:
        wait_until(lambda: worker.stopping)
    events = redis_client.xrange(QueueKeys("dq", "default").events)
    assert [(e[1]["event"], e[1]["job"]) for e in events] == [
        ("enqueued", job.id), ("claimed", job.id), ("started", job.id), ("completed", job.id)]
    result = redis_client.hget(QueueKeys("dq", "default").job(job.id), stored("result"))
    assert json.loads(result) == "e"


def test_worker_clock_running_ahead_does_not_start_jobs_early(redis_client, monkeypatch):
    """Redis time decides: a worker whose clock is a day ahead still waits for run_at."""
    import time as time_module

    real = time_module.time
    monkeypatch.setattr(time_module, "time", lambda: real() + 86_400)
    job = tasks.record.using(delay=0.5).enqueue("skewed")
    with worker_thread(queues=["default"]):
        wait_until(lambda: job.refresh().status == "completed", message="skewed job")
    assert job.started_at >= job.run_at
    (note,) = ran(redis_client)
    assert note["redis_ms"] >= job.run_at.timestamp() * 1000


def test_heartbeat_reports_lost_leases_but_not_jobs_whose_ack_just_landed(redis_client, caplog):
    from django_delayq.runtime.worker.acks import send_outcomes
    from django_delayq.worker import Outcome, Worker

    keys = QueueKeys("dq", "default")
    acked = tasks.record.enqueue("acked")
    lapsed = tasks.record.enqueue("lapsed")
    worker = Worker(["default"], concurrency=2, burst=True)
    assert worker.fetcher.claim(2)[0] == 2
    jobs = {job.id: job for job in worker.ledger.held()}
    me = threading.current_thread()
    # One job ran and its ack landed; the acker has not heard back yet.
    assert worker.ledger.start(jobs[acked.id], me, timeout=None, grace=0.0) is not None
    outcome = Outcome(jobs[acked.id], True, result_json='"acked"')
    assert worker.ledger.finish(jobs[acked.id], me)
    worker.acker.put(outcome)
    assert send_outcomes(worker.broker, [outcome]).stale == 0
    # The other one's lease is gone (lapsed and reclaimed elsewhere).
    redis_client.zrem(keys.active, lapsed.id)
    with caplog.at_level("WARNING", logger="django_delayq.worker"):
        worker.heartbeat.beat()
    lost = [r.getMessage() for r in caplog.records if "lease lost" in r.getMessage()]
    assert len(lost) == 1
    assert lapsed.id in lost[0]
    assert acked.id not in lost[0]
    assert (keys, lapsed.id, jobs[lapsed.id].attempt) not in worker.ledger
    assert (keys, acked.id, jobs[acked.id].attempt) in worker.ledger  # the acker settles it
    worker.acker.flush()
    assert (keys, acked.id, jobs[acked.id].attempt) not in worker.ledger
    assert worker.ledger.busy == 0
    assert acked.refresh().status == "completed"


@pytest.mark.django_db
def test_django_connections_are_checked_before_a_job_unless_its_thread_just_did() -> None:
    from django.db import connection

    from django_delayq.connection import get_broker
    from django_delayq.engine import ClaimedJob
    from django_delayq.runtime.worker.execution import execute
    from django_delayq.task import registry
    from django_delayq.worker.connections import DatabaseConnections

    connection.ensure_connection()
    job = ClaimedJob(keys=QueueKeys("dq", "default"), id="j", attempt=1, max_attempts=1,
                     task=tasks.connection_health_checked.name, args_json="[]",
                     kwargs_json="{}", priority=0, run_at_ms=0, enqueued_at_ms=0,
                     started_at_ms=0)
    # close_old_connections() marks an open connection as due for a health check.
    for check_first, seen_in_job in ((True, False), (False, True)):
        connection.health_check_done = True
        outcome = execute(job, registry, "w", get_broker(),
                          [DatabaseConnections()], idle=check_first)
        assert json.loads(outcome.result_json) is seen_in_job
        assert connection.health_check_done is False  # checked after the job either way


@pytest.mark.django_db(transaction=True)
def test_kept_connections_close_when_the_worker_stops(tmp_path: Path) -> None:
    """With ``CONN_MAX_AGE`` the executor threads keep their connections between jobs;
    a stopping worker closes them rather than leave them to the garbage collector (and
    the server's connection slots taken until then). The threads connect to a database
    file: Django never closes a connection to an in-memory SQLite database."""
    from django.db import connections
    from django.db.backends.signals import connection_created

    opened: list[Any] = []

    def created(connection: Any, **kwargs: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            opened.append(connection)

    default = connections.settings["default"]
    saved = {name: default[name] for name in ("CONN_MAX_AGE", "NAME")}
    default.update(CONN_MAX_AGE=None, NAME=str(tmp_path / "jobs.sqlite3"))  # kept for ever
    connection_created.connect(created, dispatch_uid="test-kept-connections")
    try:
        jobs = tasks.queries_database.enqueue_many([[] for _ in range(200)])
        with worker_thread(queues=["default"], concurrency=4):
            wait_until(lambda: Queue("default").counts()["completed"] == 200,
                       message="200 jobs to complete")
            assert opened
            assert all(c.connection is not None for c in opened)
    finally:
        connection_created.disconnect(dispatch_uid="test-kept-connections")
        default.update(saved)
    assert len(jobs.job_ids) == 200
    # the threads end as the worker returns: each closes its own as it ends
    wait_until(lambda: all(c.connection is None for c in opened),
               message="the executor threads' connections to close")


@pytest.mark.django_db(transaction=True)
def test_a_connection_a_later_job_of_a_thread_opens_is_checked_after_it() -> None:
    """The check runs only on threads that opened a connection since the last one: a
    thread whose first jobs used no database still has its connection checked after the
    first job that opens one, and after each later one."""
    from django.db import connection

    from django_delayq.connection import get_broker
    from django_delayq.engine import ClaimedJob
    from django_delayq.runtime.worker.execution import execute
    from django_delayq.task import registry
    from django_delayq.worker.connections import DatabaseConnections

    def claimed(task: str) -> ClaimedJob:
        return ClaimedJob(keys=QueueKeys("dq", "default"), id="j", attempt=1,
                          max_attempts=1, task=task, args_json="[]", kwargs_json="{}",
                          priority=0, run_at_ms=0, enqueued_at_ms=0, started_at_ms=0)

    middleware = [DatabaseConnections()]
    seen: list[tuple[bool, bool]] = []

    def thread() -> None:
        for i in range(60):
            task = tasks.queries_database if i % 3 == 2 else tasks.add
            args = [] if task is tasks.queries_database else [1, 2]
            job = claimed(task.name)
            job.args_json = json.dumps(args)
            outcome = execute(job, registry, "w", get_broker(), middleware, idle=i == 0)
            assert outcome.ok, outcome.error
            seen.append((task is tasks.queries_database, connection.health_check_done))
        connection.close()

    runner = threading.Thread(target=thread)
    runner.start()
    runner.join(timeout=60)
    assert len(seen) == 60
    assert sum(queried for queried, _ in seen) == 20
    assert not any(left_marked for queried, left_marked in seen if queried), seen


def test_every_base_exception_fails_its_job_and_the_thread_goes_on(redis_client):
    kinds = list(tasks.BASE_EXCEPTIONS)
    failing = {kind: tasks.raises.enqueue(kind) for kind in kinds}
    retried = tasks.raises_then_records.enqueue("KeyboardInterrupt")
    after = tasks.record.enqueue("after")
    with worker_thread(queues=["default"], concurrency=1) as worker:
        wait_until(lambda: after.refresh().status == "completed"
                   and retried.refresh().status == "completed", message="jobs after them")
        assert worker.executor.alive() == 1, "the one thread survived every exception"
    for kind, job in failing.items():
        job.refresh()
        assert (job.status, job.attempts) == ("failed", 1), kind
        assert job.error.startswith(("builtins." + kind, "tests.testapp.tasks." + kind)), job.error
        assert "raise BASE_EXCEPTIONS[kind]()" in job.traceback, kind
    assert failing["LibraryAbort"].error.endswith(": abort!")
    assert failing["SystemExit"].error == "builtins.SystemExit: 3"
    unprintable = failing["Unprintable"].error
    assert unprintable.startswith("tests.testapp.tasks.Unprintable: <unprintable: __str__ "
                                  "raised RuntimeError>"), unprintable
    assert (retried.attempts, retried.result) == (2, "KeyboardInterrupt")


def test_a_worker_with_no_thread_left_hands_back_its_jobs_and_asks_for_a_restart(
        redis_client, monkeypatch):
    from django_delayq.runtime.worker.executor import Executor
    from django_delayq.worker import EXIT_RESTART

    jobs = [tasks.record.enqueue(f"n{i}") for i in range(6)]

    def dies(self):
        raise SystemExit("a thread that dies outside any job")

    monkeypatch.setattr(Executor, "_serve", dies)
    with worker_thread(queues=["default"], concurrency=2, prefetch=4) as worker:
        wait_until(lambda: worker.stopping, message="the worker to give up")
    assert worker.exit_code == EXIT_RESTART
    assert ran(redis_client) == []
    for job in jobs:
        job.refresh()
        assert (job.status, job.attempts) == ("ready", 0)
    assert Queue("default").counts()["active"] == 0


def test_a_never_returning_job_gets_job_timeout_and_its_thread_goes_on(redis_client):
    stuck = tasks.never_returns.enqueue("soft")
    after = tasks.record.enqueue("after")
    assert redis_client.hget(QueueKeys("dq", "default").job(stuck.id), "o") == "500"
    assert stuck.refresh().timeout == 0.5
    with worker_thread(queues=["default"], concurrency=1) as worker:
        wait_until(lambda: stuck.refresh().status == "failed", message="the timed-out job")
        wait_until(lambda: after.refresh().status == "completed", message="the next job")
        assert worker.executor.alive() == 1
        assert not worker.stopping, "a soft limit does not stop the worker"
    assert stuck.attempts == 2, "each timed-out attempt counts, and is retried"
    assert stuck.error == "django_delayq.engine.errors.JobTimeout: the job ran past its " \
                          "time limit"
    assert "never_returns" in stuck.traceback
    assert worker.exit_code == 0


def test_the_time_limit_comes_from_using_then_the_setting(settings, redis_client):
    untimed = tasks.sleeps.enqueue(1.0)
    assert redis_client.hget(QueueKeys("dq", "default").job(untimed.id), "o") is None
    assert untimed.refresh().timeout is None
    timed = tasks.sleeps.using(timeout=0.3).enqueue(60)
    assert timed.refresh().timeout == 0.3
    with worker_thread(queues=["default"], concurrency=2):
        wait_until(lambda: timed.refresh().status == "failed", message="using(timeout=)")
        wait_until(lambda: untimed.refresh().status == "completed", message="no limit")
    settings.DELAYQ = {**settings.DELAYQ, "TIMEOUT": 0.3}
    limited = tasks.sleeps.enqueue(60)
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: limited.refresh().status == "failed", timeout=30,
                   message="DELAYQ['TIMEOUT'] to stop the job")
    assert "JobTimeout" in limited.error


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "1", True])
def test_bad_timeouts_are_refused_before_anything_is_written(redis_client, bad):
    with pytest.raises((TypeError, ValueError), match="timeout"):
        tasks.record.using(timeout=bad).enqueue("x")
    assert Queue("default").counts()["ready"] == 0


def test_jobs_waiting_in_the_buffer_are_claimed_not_active(redis_client):
    jobs = [tasks.gated.enqueue(f"b{i}", gate="gate:buffer") for i in range(4)]
    with worker_thread(queues=["default"], concurrency=1, prefetch=3) as worker:
        wait_until(lambda: Queue("default").counts()["active"] == 4, message="4 leased")
        # the start note goes out before the task runs: its own note is awaited too
        wait_until(lambda: sorted(j.refresh().status for j in jobs)
                   == ["active", "claimed", "claimed", "claimed"]
                   and len(ran(redis_client)) == 1, message="one started")
        running = next(j for j in jobs if j.status == "active")
        assert running.started_at is not None
        assert running.worker == worker.name
        for job in jobs:
            if job is not running:
                assert (job.started_at, job.worker, job.attempts) == (None, worker.name, 1)
        assert [r["tag"] for r in ran(redis_client)] == [running.args[0]]
        redis_client.set("gate:buffer", 1)
        wait_until(lambda: all(j.refresh().status == "completed" for j in jobs),
                   message="every job")
    starts = {r["tag"]: r["redis_ms"] for r in ran(redis_client) if r["task"] == "gated-start"}
    for job in jobs:
        # started_at is when a thread started it (before the task's own note), not the claim
        assert job.started_at.timestamp() * 1000 <= starts[job.args[0]] + 1
        assert job.started_at <= job.finished_at
        [entry] = job.attempt_log
        assert (entry["attempt"], entry["worker"], entry["outcome"]) == (1, worker.name,
                                                                          "completed")
        assert (entry["started_at"], entry["finished_at"]) == (job.started_at, job.finished_at)
    later = sorted(jobs, key=lambda j: j.started_at)[1:]
    assert all(j.started_at.timestamp() * 1000 >= starts[running.args[0]] for j in later)


def test_each_attempt_is_kept_in_the_attempt_log(redis_client):
    job = tasks.always_fails.enqueue("log")
    with worker_thread(queues=["default"], concurrency=1) as worker:
        wait_until(lambda: job.refresh().status == "failed", message="three attempts")
    assert [(e["attempt"], e["worker"], e["outcome"]) for e in job.attempt_log] == [
        (1, worker.name, "retried"), (2, worker.name, "retried"), (3, worker.name, "failed")]
    assert all(e["error"] == "builtins.RuntimeError: boom log" for e in job.attempt_log)
    assert all(e["started_at"] <= e["finished_at"] for e in job.attempt_log)
    assert job.attempt_log[0]["finished_at"] <= job.attempt_log[1]["started_at"]
    for entry in job.attempt_log:  # each failed attempt keeps its own traceback's end
        assert entry["traceback"].startswith("Traceback (most recent call last):\n")
        assert entry["traceback"].endswith("RuntimeError: boom log\n")
        assert "in always_fails" in entry["traceback"]


def test_an_attempts_traceback_keeps_its_last_2000_bytes_whole_characters(redis_client):
    job = tasks.raises_value_error.enqueue("é" * 3000)
    ok = tasks.record.enqueue("no traceback")
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: job.refresh().is_finished and ok.refresh().is_finished,
                   message="both jobs")
    [failed] = job.attempt_log
    # The last 2,000 bytes are a newline and 1,999 bytes of two-byte characters: the
    # first of those, cut in two, is left out.
    assert failed["traceback"] == "é" * 999 + "\n"
    assert job.traceback.endswith("ValueError: " + "é" * 3000 + "\n")  # the whole one
    [completed] = ok.attempt_log
    assert completed["traceback"] == ""
    # A job completed at its first attempt stores no log: its hash's fields imply it.
    assert redis_client.hget(f"{{dq:default}}:j:{ok.id}", "h") is None
    assert (completed["outcome"], completed["attempt"]) == ("completed", 1)


def test_a_lease_is_renewed_only_while_a_live_thread_runs_it_within_limit_plus_grace(
        redis_client):
    from django_delayq.worker import Worker

    jobs = [tasks.record.enqueue(f"r{i}") for i in range(5)]
    worker = Worker(["default"], concurrency=4, burst=True)
    assert worker.fetcher.claim(5)[0] == 5
    held = {job.id: job for job in worker.ledger.held()}
    within, past, orphaned, acking, buffered = (held[j.id] for j in jobs)
    ledger, me = worker.ledger, threading.current_thread()
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    assert ledger.start(within, me, timeout=3600, grace=5.0) is not None
    assert ledger.start(past, me, timeout=0.0, grace=0.0) is not None  # over at once
    assert ledger.start(orphaned, dead, timeout=None, grace=0.0) is not None
    assert ledger.start(acking, me, timeout=None, grace=0.0) is not None
    assert ledger.finish(acking, me)  # its ack is on its way
    assert {job.id for job in ledger.renewable()} == {within.id, acking.id, buffered.id}


def test_finished_jobs_take_room_until_their_acks_land(redis_client):
    """The jobs a worker holds unacked never exceed concurrency + prefetch: what one
    SIGKILL of it can make run twice."""
    from django_delayq.worker import Outcome, Worker

    for i in range(5):
        tasks.record.enqueue(f"f{i}")
    worker = Worker(["default"], concurrency=1, prefetch=1, burst=True)
    assert worker.fetcher.capacity() == 2
    assert worker.fetcher.claim(worker.fetcher._free_slots())[0] == 2
    job, me = worker.ledger.held()[0], threading.current_thread()
    assert worker.ledger.start(job, me, timeout=None, grace=0.0) is not None
    assert worker.ledger.finish(job, me)
    assert worker.ledger.busy == 1
    assert worker.fetcher._free_slots() == 0, "ran, but not acked: still held"
    worker.acker.put(Outcome(job, True, result_json="null"))
    worker.acker.flush()
    assert worker.fetcher._free_slots() == 1


def test_a_claim_over_several_shards_takes_no_more_than_the_room(redis_client):
    from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
    from django_delayq.worker import Worker

    broker = Broker(redis_client, EngineConfig(prefix="t", queues={"q": {"shards": 3}}))
    # Ten jobs on each shard, by id: random ids can leave one shard too few to fill a turn.
    per_shard: dict[str, list[str]] = {keys.tag: [] for keys in broker.shards("q")}
    for i in itertools.count():
        ids = per_shard[broker.keys_for("q", f"s{i}").tag]
        if len(ids) < 10:
            ids.append(f"s{i}")
        if all(len(chosen) == 10 for chosen in per_shard.values()):
            break
    broker.enqueue_many("q", [EnqueueRequest(task=tasks.record.name, args=[job_id],
                                             job_id=job_id)
                              for ids in per_shard.values() for job_id in ids])
    worker = Worker(["q"], concurrency=1, prefetch=3, burst=True, broker=broker,
                    blocking_broker=broker)
    for turn in range(3):  # each turn starts at another shard
        claimed, _ = worker.fetcher.claim(4)
        assert claimed == 4, turn
    assert worker.ledger.held_count == 12


def test_an_after_job_hook_that_raises_loses_no_outcome(redis_client):
    """The hook recycling counts jobs with: what it raises is logged, the job acked."""
    def boom() -> None:
        raise RuntimeError("hook")

    with worker_thread(queues=["default"], concurrency=1) as worker:
        worker.after_job = boom
        jobs = [tasks.record.enqueue(f"h{i}") for i in range(2)]
        wait_until(lambda: all(j.refresh().status == "completed" for j in jobs),
                   message="the jobs acked")
        wait_until(lambda: worker.ledger.held_count == 0, message="no lease left held")


def test_an_acker_error_of_no_known_kind_loses_no_outcome(redis_client, monkeypatch, caplog):
    """Whatever the acker's round trip raises (here a reply it cannot read, twice), the
    outcomes are kept and sent again, and the acker goes on: its thread dying would
    leave every later job unacked, renewed for ever, and the worker full."""
    from django_delayq.runtime.worker import acks

    real, faults = acks.send_outcomes, []

    def flaky(*args, **kwargs):
        if len(faults) < 2:
            faults.append(1)
            raise KeyError("a reply not understood")
        return real(*args, **kwargs)

    monkeypatch.setattr(acks, "send_outcomes", flaky)
    tasks.record.enqueue_many([[f"a{i}"] for i in range(300)])
    with worker_thread(queues=["default"], concurrency=4) as worker:
        wait_until(lambda: Queue("default").counts()["completed"] == 300,
                   message="every job acked")
        wait_until(lambda: worker.ledger.held_count == 0, message="no lease left held")
    assert len(faults) == 2
    assert sorted(r["tag"] for r in ran(redis_client)) == sorted(f"a{i}" for i in range(300))
    assert "acks not sent: unexpected error" in caplog.text


def test_a_shard_that_refuses_the_heartbeat_leaves_the_others_beating(redis_client, caplog):
    """One shard answering with an error (here a damaged key; on a cluster, a slot on the
    move) must not cost the other shards their renewals and reclaims, nor the worker its
    place in the registry."""
    from django_delayq.engine import Broker, EngineConfig
    from django_delayq.engine.workers import live_workers
    from django_delayq.worker import Worker

    broker = Broker(redis_client, EngineConfig(prefix="t", queues={"q": {"shards": 2}}))
    good, bad = broker.shards("q")
    job_id = next(f"j{i}" for i in itertools.count() if broker.keys_for("q", f"j{i}") == good)
    broker.enqueue("q", tasks.record.name, ["lapsed"], job_id=job_id, max_attempts=2)
    assert sum(len(r.jobs) for r in broker.claim("q", 1, "a-dead-worker")) == 1
    redis_client.zadd(good.active, {job_id: 1})  # its lease lapsed long ago
    redis_client.delete(bad.active)
    redis_client.set(bad.active, "damaged")  # every script of this shard fails
    worker = Worker(["q"], concurrency=1, broker=broker, blocking_broker=broker)
    worker.heartbeat.beat()
    assert Job.fetch(job_id, "q", broker=broker).status == "ready", "reclaimed"
    assert [w.name for w in live_workers(broker)] == [worker.name]
    assert "heartbeat refused by a shard" in caplog.text


def test_an_error_no_utf8_encodes_is_kept_and_holds_back_no_other(redis_client):
    """A job's error names a file decoded with surrogateescape, and no UTF-8 encodes a
    lone surrogate: the error is kept, the surrogate as its escape, the job retried as
    its task says, and the other jobs' acks land as usual."""
    tasks.record.enqueue_many([[f"a{i}"] for i in range(150)])
    name = b"bad-\xff.txt".decode(errors="surrogateescape")
    poison = tasks.raises_value_error.using(max_attempts=2).enqueue(f"no file {name}")
    tasks.record.enqueue_many([[f"a{i}"] for i in range(150, 300)])
    with worker_thread(queues=["default"], concurrency=4) as worker:
        wait_until(lambda: Queue("default").counts()["completed"] == 300,
                   message="every other job acked")
        wait_until(lambda: poison.refresh().status == "failed", message="the job failed")
        wait_until(lambda: worker.ledger.held_count == 0, message="no lease left held")
    assert poison.error == "builtins.ValueError: no file bad-\\udcff.txt"
    assert "bad-\\udcff.txt" in poison.traceback
    assert [e["outcome"] for e in poison.attempt_log] == ["retried", "failed"]
    assert sorted(r["tag"] for r in ran(redis_client)) == sorted(f"a{i}" for i in range(300))


def test_a_failure_redis_refuses_too_is_dropped_and_its_job_runs_again(
        redis_client, monkeypatch, caplog):
    """A job whose first attempt's ack, and then the failure replacing it, fail every
    round trip (a script error each time, here injected): the ack is dropped, so the
    lease is no longer renewed; it lapses, the job runs again, and the other jobs' acks
    land meanwhile."""
    from redis.exceptions import ResponseError

    from django_delayq.runtime.worker import acks

    real, refused = acks.send_outcomes, []

    def refusing(broker, outcomes, **kwargs):
        if any(o.job.id == poison.id and o.job.attempt == 1 for o in outcomes):
            refused.append(len(outcomes))
            raise ResponseError("ERR Error running script: a deterministic failure")
        return real(broker, outcomes, **kwargs)

    monkeypatch.setattr(acks, "send_outcomes", refusing)
    tasks.record.enqueue_many([[f"a{i}"] for i in range(150)])
    poison = tasks.record.enqueue("poison")
    tasks.record.enqueue_many([[f"a{i}"] for i in range(150, 300)])
    with worker_thread(queues=["default"], concurrency=4, lease=1.0) as worker:
        wait_until(lambda: Queue("default").counts()["completed"] == 301,
                   message="every job acked, the refused one at its second attempt")
        wait_until(lambda: worker.ledger.held_count == 0, message="no lease left held")
    assert (poison.refresh().status, poison.attempts) == ("completed", 2)
    assert refused[-1] == 1, "the refused ack ended sent alone"
    assert "Redis refused the failure of a job" in caplog.text
    assert sorted(r["tag"] for r in ran(redis_client)).count("poison") == 2


def raising_start_note(job, start_ms) -> None:
    """An executor's ``note_started`` that fails, as code around a job may."""
    raise RuntimeError("the start note went nowhere")


def claimed_in_a_ledger(broker, queue: str):
    """A ledger holding the one job claimed from ``queue``, and that job."""
    from django_delayq.runtime.worker.ledger import Ledger

    [claim] = broker.claim(queue, 1, "w")
    ledger = Ledger()
    ledger.add(claim.jobs)
    return ledger, claim.jobs[0]


def test_a_job_claimed_again_before_its_last_attempt_settles_holds_both_leases(broker):
    """Retried at once, a job can be claimed again by the same worker before the acker
    settles its failed attempt. The ledger holds both: settling the first leaves the
    second to run, and the heartbeat renews the second alone. Held by id alone, the
    second replaced the first, the first's settle dropped it (it never ran here, its
    lease lapsed) and the held count leaked one, until the fetcher claimed no more."""
    from django_delayq.runtime.worker.acks import send_outcomes
    from django_delayq.runtime.worker.outcome import failure

    tasks.record.using(max_attempts=2).enqueue("twice")
    ledger, first = claimed_in_a_ledger(broker, "default")
    me = threading.current_thread()
    assert ledger.start(first, me, timeout=None, grace=0.0) is not None
    assert ledger.finish(first, me)
    ledger.reported()
    send_outcomes(broker, [failure(first, RuntimeError("once"), retry=True, delay=0.0)],
                  worker="w")
    [claim] = broker.claim("default", 1, "w")
    [second] = claim.jobs
    assert (second.id, second.attempt) == (first.id, 2)
    ledger.add([second])
    assert ledger.held_count == 2
    assert [job.attempt for job in ledger.renewable()] == [2]
    assert ledger.lost(first.keys, [(first.id, 1)]) == [], "finished: the acker settles it"
    ledger.settle([first])
    assert (ledger.held_count, ledger.busy) == (1, 1)
    assert ledger.start(second, me, timeout=None, grace=0.0) is not None


def assert_failed_outside_its_task(broker, job, ledger, outcomes) -> None:
    """One failed outcome naming the error, no lease left running, the job failed once
    the outcome is acked."""
    from django_delayq.runtime.worker.acks import send_outcomes

    [outcome] = outcomes
    assert not outcome.ok
    assert "RuntimeError: the start note went nowhere" in outcome.error
    assert ledger.busy == 0
    send_outcomes(broker, outcomes, worker="w")
    job.refresh()
    assert (job.status, job.error) == ("failed", outcome.error)


def test_a_job_whose_run_fails_outside_its_task_is_failed_not_held(broker):
    """What raises in an executor thread around a job (not in its task) fails the job
    (retried while attempts remain): held without an outcome, its lease would be renewed
    for ever and its slot lost."""
    from django_delayq.runtime.worker.executor import Executor
    from django_delayq.task import registry

    job = tasks.record.using(max_attempts=1).enqueue("outside")
    ledger, claimed = claimed_in_a_ledger(broker, "default")
    ledger.budget = 0  # a recycling worker's last place went to it
    outcomes = []
    executor = Executor(concurrency=1, tasks=registry, name="w",
                        broker=broker, middleware=[], ledger=ledger, report=outcomes.append,
                        note_started=raising_start_note, on_thread_lost=lambda: None)
    executor.start()
    try:
        executor.deliver(claimed)
        wait_until(lambda: outcomes, message="an outcome")
    finally:
        executor.stop()
        executor.join(time.monotonic() + 30)
    assert_failed_outside_its_task(broker, job, ledger, outcomes)
    assert ledger.budget == 1, "its place given back: the recycle never counted it"
