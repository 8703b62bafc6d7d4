"""Time limits: a watchdog thread that stops jobs overrunning their limit.

*Soft* limit: when a job has run for its limit, :class:`JobTimeout` is raised inside
its thread (``PyThreadState_SetAsyncExc``). Python delivers it at the next bytecode
the thread runs, so it cannot interrupt a call that stays in C (a ``time.sleep``, a
socket read without a timeout, a long C computation) until that call returns, and a
task that catches ``BaseException`` can swallow it.

An ``async def`` job's soft limit is a cancellation on its event loop instead
(:mod:`.async_executor`): an exception raised in the loop thread could land in any of
its coroutines, or in the loop itself.

*Hard* limit, the same for both: a job still running :data:`HARD_LIMIT_GRACE` seconds
after its limit is failed with ``JobTimeout`` (acked at once, retried or dead-lettered by
the usual rules, its ``on_finished`` hooks told) and the worker stops with
:data:`.exit_codes.EXIT_RESTART`: a thread (or a loop) that cannot be stopped can only
be ended with its process, which its supervisor restarts. The heartbeat never renews a
lease past the limit plus the grace, so even a frozen process loses the job to another
worker.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from collections.abc import Callable

from ...engine import ClaimedJob, JobAborted, JobTimeout
from ...engine.logfields import log
from ..registry import TaskRegistry, timeout_seconds
from .execution import finished
from .ledger import Lease, Ledger
from .outcome import Outcome, failure

logger = logging.getLogger("django_delayq.worker")

#: Seconds a job may run past its time limit (after JobTimeout was raised in it) before
#: it is failed anyway and its worker process replaced.
HARD_LIMIT_GRACE = 5.0
#: Longest sleep of the watchdog while jobs with limits run, seconds.
TICK = 0.1


def raise_in(thread: threading.Thread, exc: type[JobTimeout] = JobTimeout) -> None:
    """Raise ``exc`` (:class:`JobTimeout`) in ``thread`` at its next Python bytecode."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                   ctypes.py_object(exc))


def raise_aborted(thread: threading.Thread) -> None:
    """Raise :class:`JobAborted` in ``thread`` at its next Python bytecode."""
    raise_in(thread, JobAborted)


def clear_pending(thread: threading.Thread) -> None:
    """Drop a JobTimeout raised in ``thread`` but not yet delivered."""
    if thread.ident is not None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), None)


def limits_of(job: ClaimedJob, tasks: TaskRegistry,
              default: float | None) -> tuple[float | None, float]:
    """A job's time limit in seconds (its own, else its task's, else ``default``) and,
    when it has one, the delay of its retry should it overrun it."""
    task = tasks.find(job.task)
    limit: float | None = job.timeout_ms / 1000 if job.timeout_ms > 0 else None
    if limit is None and task is not None:
        limit = timeout_seconds(task)
    if limit is None:
        limit = default
    delay = 1.0 if limit is None or task is None else task.retry_delay(job.attempt)
    return limit, delay


class Watchdog:
    """Raises soft limits and enforces hard ones over the ledger's running leases."""

    def __init__(self, *, ledger: Ledger, name: str,
                 grace: float, report: Callable[[Outcome], None],
                 on_stuck: Callable[[threading.Thread], None],
                 done: threading.Event, loop_stalled_for: Callable[[], float] | None = None,
                 on_loop_stalled: Callable[[float], None] | None = None) -> None:
        self.ledger = ledger
        self.name = name
        self.grace = grace
        self._report = report
        self._on_stuck = on_stuck
        self._done = done
        #: How long the event loop of async jobs has stalled, watched (``on_loop_stalled``
        #: is told once per stall, with its length so far).
        self._loop_stalled_for = loop_stalled_for
        self._on_loop_stalled = on_loop_stalled
        self._loop_was_stalled = False

    def run(self) -> None:
        while not self._done.wait(self.check()):
            self.check_loop()

    def check_loop(self) -> None:
        """Tell ``on_loop_stalled`` once when the event loop stalls (again)."""
        if self._loop_stalled_for is None or self._on_loop_stalled is None:
            return
        stalled = self._loop_stalled_for()
        if stalled and not self._loop_was_stalled:
            self._on_loop_stalled(stalled)
        elif not stalled and self._loop_was_stalled:
            log(logger, logging.WARNING, "event loop runs again", worker=self.name)

        self._loop_was_stalled = bool(stalled)

    def check(self) -> float:
        """Enforce every limit due; returns seconds until the next check."""
        now = time.monotonic()
        wait = 1.0
        for lease in self.ledger.running():
            if lease.limit_at is None or lease.shielded:
                continue
            aborted = lease.abort_by is not None
            if (now >= lease.limit_at and not lease.interrupted
                    and self.ledger.interrupt(lease, raise_aborted if aborted else raise_in)):
                if aborted:
                    log(logger, logging.WARNING, "job aborted, JobAborted raised in it",
                        job=lease.job.id, queue=lease.job.queue, task=lease.job.task,
                        by=lease.abort_by, worker=self.name)
                else:
                    log(logger, logging.WARNING, "job over its time limit, JobTimeout raised "
                        "in it", job=lease.job.id, queue=lease.job.queue, task=lease.job.task,
                        timeout_s=lease.timeout, worker=self.name)
            hard_at = lease.renew_until if aborted and lease.renew_until else \
                lease.limit_at + self.grace
            if now >= hard_at:
                self._hard_limit(lease)
                continue
            wait = min(wait, (lease.limit_at if now < lease.limit_at else hard_at) - now)
        return max(0.01, min(wait, TICK if wait < 1.0 else 1.0))

    def _hard_limit(self, lease: Lease) -> None:
        thread = lease.thread
        if thread is None or not self.ledger.abandon(lease.job):
            return
        job = lease.job
        log(logger, logging.ERROR, f"job still running {self.grace:.1f}s after its time "
            "limit or abort: failing it, and stopping this worker to be restarted",
            job=job.id, queue=job.queue, task=job.task, thread_name=thread.name,
            worker=self.name)
        why = ("it blocked the event loop, or swallowed the cancellation" if lease.on_loop
               else "blocked in C code, or it caught JobTimeout")
        exc = JobTimeout(f"the job ran past its time limit of {lease.timeout}s and did not "
                         f"stop within {self.grace}s ({why}); its worker process was replaced")
        if lease.abort_by is not None:
            exc = JobAborted(f"aborted by {lease.abort_by}; it did not stop within "
                             f"{lease.grace:g}s ({why}): its worker process was replaced")
        outcome = failure(job, exc, retry=True, delay=lease.retry_delay)
        outcome.started_ms = lease.started_ms
        outcome.finished_ms = lease.started_ms + int((time.monotonic() - lease.began) * 1000)
        self._report(outcome)
        self._on_stuck(thread)
        finished(lease.on_finished, outcome)  # the thread that ran it will not: abandoned
