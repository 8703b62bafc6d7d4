"""``async def`` tasks: the event loop of each worker process, its own concurrency, time
limits by cancellation, the ORM through ``sync_to_async``, and the Tasks API."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT, OutputReader, ran, wait_until, worker_env, worker_thread
from tests.testapp import standard_tasks as st
from tests.testapp import tasks

# The ORM test leaves a connection on sync_to_async's thread, which later jobs check.
pytestmark = pytest.mark.django_db(transaction=True)


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


def test_an_async_job_past_its_time_limit_is_cancelled_and_fails(redis_client):
    job = tasks.async_overrun.enqueue("late")
    after = tasks.add.enqueue(1, 1)
    proc = subprocess.Popen(
        [sys.executable, "-m", "django", "runworker", "async", "default", "-c", "1"],
        cwd=ROOT,
        env=worker_env(DELAYQ_TEST_SETTINGS=json.dumps({"TIMEOUT": 1})),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = OutputReader(proc)
    try:
        wait_until(lambda: job.refresh().status == "failed", timeout=60,
                   message="the overrunning job to fail")
        assert "JobTimeout" in job.error
        assert job.attempts == 1
        wait_until(lambda: after.refresh().status == "completed", timeout=30,
                   message="the worker to go on")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


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
