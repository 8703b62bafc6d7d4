"""``async def`` tasks: the event loop of each worker process, its own concurrency, time
limits by cancellation, the ORM through ``sync_to_async``, and the Tasks API."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from django_delayq import Queue
from tests.conftest import ran, wait_until, worker_thread
from tests.test_worker import (
    assert_failed_outside_its_task,
    claimed_in_a_ledger,
    raising_start_note,
)
from tests.testapp import standard_tasks as st
from tests.testapp import tasks


def most_at_once(records: list[dict], start: str, end: str) -> int:
    """The most jobs between their ``start`` and ``end`` notes at the same moment."""
    now = peak = 0
    for r in records:
        now += 1 if r["task"] == start else -1 if r["task"] == end else 0
        peak = max(peak, now)
    return peak


def test_async_jobs_run_at_once_on_one_thread_within_their_concurrency(redis_client,
                                                                      spawned):
    jobs = [tasks.async_gated.enqueue(f"a{i}", gate="gate:async") for i in range(8)]
    proc, out = spawned("async", "-c", "1", "--async-concurrency", "5")
    # one worker thread, yet five jobs awaiting asyncio.sleep together
    wait_until(lambda: len([r for r in ran(redis_client) if r["task"] == "async-start"]) == 5,
               timeout=60, message="five async jobs to start")
    redis_client.set("gate:async", 1)
    for job in jobs:
        wait_until(lambda job=job: job.refresh().status == "completed", timeout=60,
                   message="the async jobs to complete")
    assert sorted(j.refresh().result for j in jobs) == sorted(f"a{i}" for i in range(8))
    assert most_at_once(ran(redis_client), "async-start", "async-end") == 5
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


@pytest.mark.parametrize("how", ["setting", "option"])
def test_an_async_job_past_its_time_limit_is_cancelled_and_fails(redis_client, spawned, how):
    """The limit of a job whose task sets none: DELAYQ["TIMEOUT"], or runworker --timeout."""
    job = tasks.async_overrun.enqueue("late")
    after = tasks.add.enqueue(1, 1)
    if how == "setting":
        proc, out = spawned("async", "default", "-c", "1",
                            env={"DELAYQ_TEST_SETTINGS": json.dumps({"TIMEOUT": 1})})
    else:
        proc, out = spawned("async", "default", "-c", "1", "--timeout", "1")
    wait_until(lambda: job.refresh().status == "failed", timeout=60,
               message=f"the overrunning job to fail:\n{out.text}")
    assert job.error == ("django_delayq.engine.errors.JobTimeout: the job ran past its time "
                         "limit of 1.0s")
    assert job.attempts == 1
    wait_until(lambda: after.refresh().status == "completed", timeout=30,
               message="the worker to go on")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


@pytest.mark.parametrize(("task", "arg", "note"), [
    (tasks.async_blocks_loop, 3600, "async-blocks"),
    (tasks.async_swallows_cancel, "s", "async-swallowed"),
])
def test_an_async_job_that_will_not_stop_is_failed_at_the_hard_limit(redis_client, spawned,
                                                                    task, arg, note):
    """A coroutine calling time.sleep cannot be cancelled, one swallowing CancelledError
    goes on: the hard limit fails the job and its host replaces the worker process."""
    job = task.enqueue(arg)
    other = tasks.add.enqueue(2, 2)
    proc, out = spawned("async", "default", "-c", "1")
    out.wait_for("worker-0 exited to be replaced", timeout=90)
    job.refresh()
    assert (job.status, job.attempts) == ("failed", 1)
    assert job.error.startswith("django_delayq.engine.errors.JobTimeout: the job ran past its "
                                "time limit of 0.5s and did not stop within 5.0s"), job.error
    assert "(it blocked the event loop, or swallowed the cancellation)" in job.error
    assert [r["task"] for r in ran(redis_client)].count(note) >= 1
    assert other.refresh().status == "completed", "threads ran jobs meanwhile"
    assert "stopping this worker to be restarted" in out.text
    assert Queue("async").counts()["active"] == 0, "nothing is left leased"
    later = tasks.add.enqueue(3, 3)
    wait_until(lambda: later.refresh().status == "completed", timeout=60,
               message=f"a job run by the fresh process:\n{out.text}")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_a_dead_event_loop_replaces_the_process_and_its_job_runs_again(redis_client, spawned):
    job = tasks.async_kills_loop.enqueue("k")
    proc, out = spawned("async", "-c", "1")
    wait_until(lambda: job.refresh().status == "completed", timeout=60,
               message=f"the job run again by a fresh process:\n{out.text}")
    assert "event loop thread ended unexpectedly" in out.text
    assert "handing back running jobs jobs=1" in out.text  # at once, not left to its lease
    assert "worker-0 exited to be replaced" in out.text
    assert (job.status, job.attempts, job.result) == ("completed", 2, "k")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_a_stalled_loop_is_reported_and_its_waiting_jobs_go_back(redis_client, broker,
                                                                  monkeypatch):
    """A coroutine that blocks the loop (with no time limit to end it): the worker's
    health says so, the jobs waiting for a slot are handed back for other workers and
    nothing more is claimed for the loop; once it runs again, every job completes."""
    from django_delayq.runtime.health import check_workers
    from django_delayq.runtime.worker import async_executor

    monkeypatch.setattr(async_executor, "LOOP_STALL", 0.5)
    blocker = tasks.async_blocks_loop_until.enqueue("gate:loop", "b")
    with worker_thread(queues=["async"], async_concurrency=2, lease=1.5) as worker:
        wait_until(lambda: any(r["task"] == "async-blocks-until" for r in ran(redis_client)),
                   message="the loop blocked")
        waiting = [tasks.async_add.enqueue(i, i) for i in range(5)]
        wait_until(lambda: any("event loop" in h.problem
                               for h in check_workers(broker, default_lease=30)),
                   message="the stall in the worker's health")
        wait_until(lambda: all(j.refresh().status == "ready" for j in waiting),
                   message="the waiting jobs handed back")
        assert Queue("async").counts()["ready"] == 5
        assert worker.ledger.held_in("loop") == 1, "only the job that blocks the loop"
        redis_client.set("gate:loop", 1)
        wait_until(lambda: all(j.refresh().status == "completed" for j in [blocker, *waiting]),
                   message="every job once the loop runs again")
        wait_until(lambda: not any(h.problem for h in check_workers(broker, default_lease=30)),
                   message="healthy again")
    assert [j.refresh().attempts for j in waiting] == [1] * 5


@pytest.fixture
def orm_on_the_sync_thread() -> Iterator[None]:
    """Forget, once the test is over, the database connections the ORM opened on
    ``sync_to_async``'s thread (an in-memory SQLite ignores ``close()``): the worker
    checks that thread's connections around every async job, and a later test without
    database access would find this one there."""
    yield

    def forget() -> None:
        for alias in list(connections):
            connections[alias].close()
            del connections[alias]

    asyncio.run(sync_to_async(forget)())


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("orm_on_the_sync_thread")
def test_an_async_task_uses_the_orm_through_sync_to_async():
    from django.contrib.auth.models import User

    job = tasks.async_orm.enqueue("from-async")
    unsafe = tasks.async_orm_unsafe.enqueue()
    with worker_thread(queues=["async"], concurrency=1):
        wait_until(lambda: job.refresh().is_finished and unsafe.refresh().is_finished,
                   message="the ORM jobs to finish")
    assert job.status == "completed", job.error
    assert User.objects.get(username="from-async").pk == job.result
    assert unsafe.status == "failed"
    assert "SynchronousOnlyOperation" in unsafe.error


def test_call_and_acall_of_an_async_task(redis_client):
    redis_client.set("gate:call", 1)
    assert tasks.async_gated.call("c", gate="gate:call") == "c"
    assert asyncio.run(tasks.async_gated.acall("d", gate="gate:call")) == "d"
    assert asyncio.run(tasks.add.acall(2, 3)) == 5
    job = asyncio.run(tasks.add.aenqueue(4, 5))
    assert job.refresh().status == "ready"


def test_a_django_async_task_runs_on_the_backend(redis_client):
    result = st.dj_async_add.enqueue(2, 3)
    with worker_thread(queues=["async"], concurrency=1):
        wait_until(lambda: result.refresh() or result.is_finished,
                   message="the Django async task to finish")
    assert result.return_value == 5
    assert st.dj_async_add.call(1, 1) == 2
    assert asyncio.run(st.dj_async_add.aenqueue(3, 4)).id


def test_a_leaking_async_exception_does_not_lose_the_job(redis_client):
    """Whatever a coroutine raises (a BaseException included), its job gets an outcome."""
    job = tasks.async_base_exception.enqueue()
    with worker_thread(queues=["async"], concurrency=1):
        wait_until(lambda: job.refresh().is_finished, message="the job to finish")
    assert job.status == "failed"
    assert "KeyboardInterrupt" in job.error


def test_an_after_job_hook_that_raises_loses_no_async_outcome(redis_client):
    def boom() -> None:
        raise RuntimeError("hook")

    with worker_thread(queues=["async"], concurrency=1) as worker:
        worker.after_job = boom
        jobs = [tasks.async_add.enqueue(i, 1) for i in range(2)]
        wait_until(lambda: all(j.refresh().status == "completed" for j in jobs),
                   message="the async jobs acked")
        wait_until(lambda: worker.ledger.held_count == 0, message="no lease left held")


def test_an_async_job_whose_run_fails_outside_its_task_is_failed_not_held(broker):
    """What raises on the event loop around a job (not in its task) reaches the future
    of its run: logged, and the job failed instead of held for ever."""
    from django_delayq.runtime.worker.async_executor import AsyncExecutor
    from django_delayq.task import registry

    job = tasks.async_add.enqueue(1, 2)
    ledger, claimed = claimed_in_a_ledger(broker, "async")
    outcomes = []
    executor = AsyncExecutor(tasks=registry, name="w",
                             broker=broker, middleware=[], ledger=ledger,
                             report=outcomes.append, note_started=raising_start_note,
                             on_loop_lost=lambda: None, concurrency=10)
    try:
        executor.submit(claimed)
        wait_until(lambda: outcomes, message="an outcome")
    finally:
        executor.stop()
    assert_failed_outside_its_task(broker, job, ledger, outcomes)


def test_a_stopped_worker_closes_its_event_loop_after_hundreds_of_jobs(redis_client):
    """The loop's selector and self-pipe are freed as the worker stops, not left to the
    end of the process: a worker run in a thread of a longer-lived process leaks none."""
    jobs = [tasks.async_add.enqueue(i, 1) for i in range(300)]
    with worker_thread(queues=["async"], concurrency=1, async_concurrency=20) as worker:
        wait_until(lambda: all(j.refresh().status == "completed" for j in jobs),
                   timeout=120, message="the async jobs to complete")
        loop = worker._async._loop
        assert loop is not None
        assert loop.is_running()
    assert loop.is_closed()
    assert sorted(j.result["sum"] for j in jobs) == [i + 1 for i in range(300)]
