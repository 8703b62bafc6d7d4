"""Stopping a running job (``Job.abort()``) through real ``runworker`` processes: a task
that checks ``current_job().abort_requested`` stops by itself, one that does not gets
JobAborted raised in it, an async one is cancelled, one holding the GIL has its process
killed and replaced; each ends ``cancelled`` with who asked, and the worker goes on."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from django_delayq import Job, JobAborted, JobTimeout, Queue
from django_delayq.connection import get_broker
from django_delayq.engine.status import Status
from tests.conftest import ran, wait_until, worker_pids
from tests.testapp import tasks

#: Short leases: the heartbeat (a third of the lease) brings the abort within a second.
FAST = ("--lease", "3")


def started(client: Any, job: Job, timeout: float = 90) -> None:
    wait_until(lambda: job.refresh().status in (Status.CLAIMED, Status.ACTIVE),
               timeout=timeout, message=f"job {job.id} to start (status {job.status})")


def ends_cancelled(job: Job, out: Any, timeout: float = 90) -> Job:
    wait_until(lambda: job.refresh().status == Status.CANCELLED, timeout=timeout,
               message=f"job {job.id} to end cancelled (status {job.status}, "
                       f"error {job.error}):\n{out.text}")
    return job


def test_a_pending_job_is_cancelled_at_once_with_who_asked(redis_client):
    job = tasks.record.using(delay=600).enqueue("later")
    assert job.abort(by="alice") is True
    job.refresh()
    assert (job.status, job.aborted_by) == (Status.CANCELLED, "alice")
    assert job.abort(by="bob") is False  # over: nothing to stop
    assert job.refresh().aborted_by == "alice"
    job.retry(delay=600)  # a new run: the abort was the last one's
    assert (job.refresh().status, job.aborted_by) == (Status.SCHEDULED, "")


@pytest.mark.parametrize("processes", ["1", "2"], ids=["one-process", "pool"])
def test_a_cooperative_job_stops_by_itself_and_ends_cancelled(processes, redis_client,
                                                              spawned):
    job = tasks.stops_when_aborted.enqueue("coop")
    proc, out = spawned("default", "-c", "2", "--processes", processes, *FAST)
    started(redis_client, job)
    assert job.abort(by="alice") is True
    ends_cancelled(job, out)
    assert job.aborted_by == "alice"
    assert job.error == "django_delayq.engine.errors.JobAborted: aborted by alice"
    assert job.attempts == 1, "never retried, though it has attempts left"
    assert job.attempt_log[-1]["outcome"] == "aborted"
    noticed = [r for r in ran(redis_client) if r["task"] == "abort_noticed"]
    assert noticed == [{**noticed[0], "tag": "coop", "by": "alice"}]
    worker_pids(out, int(processes))
    assert "killed" not in out.text, "a cooperative stop replaces no process"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


@pytest.mark.parametrize("processes", ["1", "2"], ids=["one-process", "pool"])
def test_jobs_that_do_not_check_get_job_aborted_and_the_others_run_on(processes,
                                                                      redis_client, spawned):
    """Many long jobs, half of them aborted: those end cancelled through JobAborted, the
    others complete, and no process is replaced."""
    jobs = [tasks.sleeps.enqueue(3.0) for _ in range(8)]
    proc, out = spawned("default", "-c", "4", "--processes", processes, *FAST)
    wait_until(lambda: sum(j.refresh().status == Status.ACTIVE for j in jobs) >= 4,
               timeout=60, message=f"four jobs to run:\n{out.text}")
    aborted = [j for j in jobs if j.status == Status.ACTIVE]
    for job in aborted:
        assert job.abort(by="ops") is True
    for job in aborted:
        ends_cancelled(job, out)
        assert job.error.startswith("django_delayq.engine.errors.JobAborted"), job.error
        assert job.aborted_by == "ops"
    others = [j for j in jobs if j not in aborted]
    wait_until(lambda: all(j.refresh().status == Status.COMPLETED for j in others),
               timeout=90, message=f"the other jobs to complete:\n{out.text}")
    assert Queue("default").counts()["active"] == 0
    assert "killed" not in out.text
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_the_dependants_of_an_aborted_job_follow_their_policy(redis_client, spawned):
    from django_delayq import chain

    cancelled = chain(tasks.sleeps.bind(600), tasks.record.bind("never")).enqueue()
    run = chain(tasks.sleeps.bind(600), tasks.record.bind("runs"),
                on_parent_failure="run").enqueue()
    proc, out = spawned("default", "-c", "2", *FAST)
    for parent in (cancelled[0], run[0]):
        started(redis_client, parent)
        parent.abort(by="flow")
    for parent in (cancelled[0], run[0]):
        ends_cancelled(parent, out)
    wait_until(lambda: cancelled[1].refresh().status == Status.CANCELLED, timeout=60,
               message=f"the dependant to be cancelled:\n{out.text}")
    wait_until(lambda: run[1].refresh().status == Status.COMPLETED, timeout=60,
               message=f"the dependant that runs anyway to run:\n{out.text}")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_a_claimed_job_aborted_before_it_starts_never_runs(redis_client, spawned):
    first = tasks.sleeps.enqueue(600)
    second = tasks.stops_when_aborted.enqueue("buffered")
    proc, out = spawned("default", "-c", "1", "--prefetch", "2", *FAST)
    started(redis_client, first)
    wait_until(lambda: second.refresh().status == Status.CLAIMED, timeout=60,
               message=f"the second job to wait in the worker's buffer:\n{out.text}")
    second.abort(by="early")
    first.abort(by="early")
    ends_cancelled(second, out)
    ends_cancelled(first, out)
    assert second.error == "django_delayq.engine.errors.JobAborted: aborted by early"
    assert not [r for r in ran(redis_client) if r["task"] == "stops_when_aborted"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_an_async_job_is_cancelled(redis_client, spawned):
    job = tasks.async_overrun.enqueue("a1")
    after = tasks.async_add.enqueue(1, 2)
    proc, out = spawned(tasks.ASYNC, "-c", "1", *FAST)
    started(redis_client, job)
    job.abort(by="carol")
    ends_cancelled(job, out)
    assert job.error == "django_delayq.engine.errors.JobAborted: aborted by carol"
    wait_until(lambda: after.refresh().status == Status.COMPLETED, timeout=60,
               message=f"the next async job to run:\n{out.text}")
    assert "killed" not in out.text
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_a_job_that_stops_within_its_grace_keeps_its_process_however_late_it_hears(
        redis_client, spawned):
    """With the default lease a process hears of an abort up to 10 s after it was asked
    (its next lease renewal), later than its host, which reads the aborts every 5 s.
    Asked just after a renewal, the job hears last; it then stops within the grace (it
    cleans up for 3 s after JobAborted). Its process is not killed: the host waits for
    the process to hear, so the job beside it runs on, once."""
    job = tasks.winds_down_when_aborted.enqueue("late", 3.0)
    beside = tasks.sleeps.enqueue(25.0)
    proc, out = spawned("default", "-c", "2", "--processes", "1", "--lease", "60")
    wait_until(lambda: {job.refresh().status, beside.refresh().status} == {Status.ACTIVE},
               timeout=90, message=f"both jobs to run:\n{out.text}")
    keys = get_broker().keys_for("default", job.id)
    renewed = redis_client.zscore(keys.active, job.id)
    wait_until(lambda: redis_client.zscore(keys.active, job.id) != renewed, timeout=30,
               interval=0.01, message="a lease renewal")
    assert job.abort(by="erin") is True
    ends_cancelled(job, out)
    assert [r["tag"] for r in ran(redis_client) if r["task"] == "wound_down"] == ["late"]
    wait_until(lambda: beside.refresh().status == Status.COMPLETED, timeout=90,
               message=f"the job beside it to complete:\n{out.text}")
    assert beside.attempts == 1
    assert "killed" not in out.text
    assert out.text.count("started worker-") == 1, "no process replaced"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


@pytest.mark.parametrize("processes", ["1", "2"], ids=["one-process", "pool"])
def test_a_job_holding_the_gil_has_its_process_replaced(processes, redis_client, spawned):
    """No thread of its process runs, so it never hears of the abort: its host, which
    reads the aborts with its heartbeat, kills it after the grace and the margin."""
    job = tasks.holds_gil_unlimited.enqueue("gil")
    proc, out = spawned("default", "-c", "1", "--processes", processes, "--lease", "60")
    started(redis_client, job)
    job.abort(by="dave")
    ends_cancelled(job, out)
    assert job.aborted_by == "dave"
    assert job.error.startswith("django_delayq.engine.errors.JobAborted: aborted by dave; "
                                "it did not stop within the grace"), job.error
    assert "killed and replaced" in job.error
    after = tasks.record.enqueue("after")
    wait_until(lambda: after.refresh().status == Status.COMPLETED, timeout=90,
               message=f"a job after it to run on the replacement:\n{out.text}")
    worker_pids(out, int(processes) + 1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_job_aborted_is_a_job_timeout():
    """Code that lets a time limit through (``except JobTimeout: raise``) lets an abort
    through too."""
    assert issubclass(JobAborted, JobTimeout)
    assert not issubclass(JobAborted, Exception)
