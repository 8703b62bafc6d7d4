"""Every worker process is supervised by its host: a job no thread of its own can stop
(blocked in C, holding the GIL, swallowing JobTimeout) fails by its time limit and the
process is replaced, whatever it runs; what a process held comes back when it ends;
stops, restarts and recycles keep their bounds."""

from __future__ import annotations

import math
import os
import signal
from collections import Counter
from typing import Any

import pytest

from django_delayq import Queue
from django_delayq.runtime.children import kill_at
from django_delayq.runtime.deadlines import KILL_MARGIN, Board, Posted
from django_delayq.runtime.host import Host
from tests.conftest import ran, wait_until, worker_pids
from tests.testapp import tasks

HUNG = {"blocked-in-c": tasks.blocks_in_c, "holding-the-gil": tasks.holds_gil,
        "swallowing-its-timeout": tasks.swallows_timeout}


def starts(client: Any, kind: str) -> list[dict[str, Any]]:
    return [r for r in ran(client) if r["task"] == kind]


@pytest.mark.parametrize("processes", ["1", "2"], ids=["one-process", "pool"])
@pytest.mark.parametrize("kind", list(HUNG))
def test_a_hung_job_fails_by_its_limit_and_the_jobs_after_it_run(kind, processes,
                                                                 redis_client, spawned):
    hung = HUNG[kind].enqueue(kind)
    after = [tasks.record.enqueue(f"n{i}") for i in range(30)]
    proc, out = spawned("default", "-c", "1", "--prefetch", "3", "--processes", processes)
    wait_until(lambda: hung.refresh().status == "failed", timeout=90,
               message=f"the hung job to fail:\n{out.text}")
    assert hung.error.startswith("django_delayq.engine.errors.JobTimeout: the job ran past "
                                 "its time limit of 0.5s"), hung.error
    if kind == "holding-the-gil":  # its process ran no Python: its host killed it
        assert "the process was killed and replaced" in hung.error
        out.wait_for("worker-0 killed pid=", "worker-1 killed pid=")
    wait_until(lambda: all(job.refresh().status == "completed" for job in after),
               timeout=90, message=f"the jobs after it to run:\n{out.text}")
    assert [job.attempts for job in after] == [1] * len(after), \
        "jobs claimed but not started by the ended process went back unattempted"
    assert Queue("default").counts()["active"] == 0
    worker_pids(out, int(processes) + 1)  # the process that ran it was replaced
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_a_frozen_process_is_killed_at_a_stop_within_the_grace_period_and_a_margin(
        redis_client, spawned):
    """A job with no time limit holding the GIL: the SIGTERM never reaches the process's
    handler, so the host kills it once the grace period (and a margin) is over; its
    job is handed back at once, failed for good on its only attempt."""
    job = tasks.holds_gil_unlimited.enqueue("stuck")
    proc, out = spawned("default", "-c", "1", "--processes", "2", "--grace-period", "1",
                        "--lease", "60")
    wait_until(lambda: starts(redis_client, "holds_gil_unlimited"), timeout=60,
               message=f"the job to start:\n{out.text}")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 1, out.text  # a forced stop: a job was cut short
    assert "still running: killed" in out.text
    job.refresh()
    assert job.status == "failed"
    assert job.error.startswith("WorkerLost: worker "), job.error
    assert Queue("default").counts()["active"] == 0


def test_the_jobs_of_a_killed_process_come_back_at_once_not_after_the_lease(
        redis_client, spawned):
    """The OOM killer (here, a SIGKILL) ends a worker process: its host hands back what
    it held at once, though the lease is an hour: the running job runs again (its
    attempt counted), the buffered ones once (theirs not)."""
    running = tasks.gated.enqueue("r", gate="gate:killed")
    buffered = [tasks.record.enqueue(f"b{i}") for i in range(3)]
    proc, out = spawned("default", "-c", "1", "--prefetch", "3", "--lease", "3600")
    wait_until(lambda: starts(redis_client, "gated-start"), timeout=60,
               message=f"the gated job to start:\n{out.text}")
    (first,) = worker_pids(out, 1)
    redis_client.set("gate:killed", 1)  # the job's second run passes the gate
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: running.refresh().status == "completed", timeout=60,
               message=f"the running job to run again:\n{out.text}")
    assert running.attempts == 2
    assert running.attempt_log[0]["error"].startswith("WorkerLost: worker ")
    # The new process may run the buffered jobs after the gated one: wait for them too.
    wait_until(lambda: all(job.refresh().status == "completed" for job in buffered),
               timeout=60, message=f"the buffered jobs to run:\n{out.text}")
    assert [job.attempts for job in buffered] == [1, 1, 1]
    out.wait_for("handed_back=")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_a_child_that_exits_0_by_itself_is_restarted(redis_client, spawned):
    """A SIGTERM sent to a child (not to its host) stops it cleanly: its host did not
    ask for it, so it starts another."""
    proc, out = spawned("default", "--processes", "2", "-c", "1")
    victim = worker_pids(out, 2)[0]
    wait_until(lambda: out.text.count("worker started worker=") == 2, timeout=60,
               message="both worker processes to set their stop signals up")
    os.kill(victim, signal.SIGTERM)
    out.wait_for(f"died pid={victim} code=0")
    worker_pids(out, 3)
    job = tasks.add.enqueue(1, 2)
    wait_until(lambda: job.refresh().status == "completed", timeout=60,
               message="a job after the restart")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_recycling_is_exact_whatever_the_threads_and_prefetch(redis_client, spawned):
    jobs = [tasks.record.enqueue(f"m{i}") for i in range(60)]
    proc, out = spawned("default", "--processes", "2", "-c", "4", "--max-jobs-per-child", "3")
    wait_until(lambda: all(job.refresh().status == "completed" for job in jobs), timeout=120,
               message=f"every job:\n{out.text}")
    per_pid = Counter(r["pid"] for r in starts(redis_client, "record"))
    assert sum(per_pid.values()) == 60, "each job ran once"
    assert max(per_pid.values()) <= 3, per_pid
    out.wait_for("exit_code=75")  # the log says the code the process exits with
    assert "exit_code=0" not in out.text.split("host stopping")[0]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


def test_claims_are_balanced_between_processes_serving_async_and_sync_queues(
        redis_client, spawned):
    """Each process claims for its threads what they can run (no prefetch before a job
    has run), whatever its event loop's slots: a burst of slow jobs spreads."""
    for i in range(8):
        tasks.gated.enqueue(f"g{i}", gate="gate:balance")
    proc, out = spawned("default", tasks.ASYNC, "--processes", "2", "-c", "2",
                        "--async-concurrency", "10")
    wait_until(lambda: len(starts(redis_client, "gated-start")) == 4, timeout=60,
               message=f"each thread to start a job:\n{out.text}")
    per_pid = Counter(r["pid"] for r in starts(redis_client, "gated-start"))
    assert sorted(per_pid.values()) == [2, 2], per_pid
    assert Queue("default").counts()["ready"] == 4, "the rest wait for a free thread"
    redis_client.set("gate:balance", 1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0, out.text


@pytest.mark.parametrize("option", ["--processes", "--concurrency", "--async-concurrency"])
def test_a_pool_no_machine_can_run_is_refused(option, spawned):
    proc, out = spawned("default", option, "100000")
    assert proc.wait(timeout=60) == 1
    assert f"{option} 100000 is above DELAYQ['MAX_" in out.text
    assert "started worker-" not in out.text


def test_the_board_shows_posted_jobs_whole_and_forgets_cleared_ones():
    board = Board.create(3)
    try:
        first = board.post("q", "a" * 128, 2, started_ms=5, hard_at=10.0, timeout=1.5,
                           retry_delay_ms=300)
        board.post("x" * 64, "b", 1, started_ms=2**40)
        assert board.posted() == [Posted("q", "a" * 128, 2, 10.0, 1.5, 300, 5),
                                  Posted("x" * 64, "b", 1, math.inf, 0.0, 1000, 2**40)]
        board.post("c", "c", 1, started_ms=0)
        assert board.post("d", "d", 1, started_ms=0) is None, "three slots"
        assert first is not None
        board.clear(first)
        assert [p.job_id for p in board.posted()] == ["b", "c"]
        assert board.last_stamp(os.getpid()) is None
        board.stamp()
        assert board.last_stamp(os.getpid()) is not None
        assert board.last_stamp(os.getpid() + 1) is None, "another process's stamp"
        reader = Board(board.fd, 3)  # the host's own mapping of the same block
        assert [p.job_id for p in reader.posted()] == ["b", "c"]
        reader.reset()
        assert board.posted() == []
    finally:
        board.close()


def test_a_host_kills_for_an_abort_only_once_the_process_should_have_heard_of_it():
    """The host reads the aborts every 5 s, the process with its next lease renewal, up
    to 10 s later: killing at the host's note plus the grace took the processes of jobs
    that were stopping in time."""
    unlimited = Posted("q", "j", 1, math.inf, 0.0, 1000, 0)
    assert kill_at(unlimited, None) == math.inf
    noted = 100.0
    # never heard of (holding the GIL): a beat, the abort's notice, its grace, the margin
    assert kill_at(unlimited, noted) == noted + 10.0 + 1.0 + 5.0 + KILL_MARGIN
    heard = Posted("q", "j", 1, noted + 9.0 + 1.0 + 5.0, 0.0, 1000, 0, aborted_by="ops")
    assert kill_at(heard, noted) == heard.hard_at + KILL_MARGIN, "its own deadline"
    limited = Posted("q", "j", 1, noted + 3.0, 60.0, 1000, 0)
    assert kill_at(limited, noted) == noted + 3.0 + KILL_MARGIN, "a time limit first"


def test_a_service_that_ends_after_a_long_run_restarts_at_the_first_delay(broker):
    """A service thread that ends again and again at once waits longer each time; one
    that ends after a long run (one outage a week) starts over from the first delay."""

    class EndsAtOnce:
        name = "ends"

        def run(self) -> None:
            pass

        def stop(self, *, drain: bool) -> None:
            pass

    host = Host(broker=broker, services=[EndsAtOnce()])
    running = host._services[0]
    now, delays = 1000.0, []
    for ran_for in (0.1, 0.1, 0.1, 0.1, 0.1, 0.1, 3600.0, 0.1):
        host._keep_services(now)  # started
        assert running.thread is not None
        running.thread.join(10)
        now += ran_for
        host._keep_services(now)  # its end noted
        delays.append(running.start_at - now)
        now = running.start_at
    assert delays == pytest.approx([1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 1.0, 2.0])
