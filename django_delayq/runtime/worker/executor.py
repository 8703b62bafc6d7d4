"""The executors: ``concurrency`` threads that run claimed jobs, one at a time each.

Jobs arrive in an inbox (the buffer of claimed jobs); each thread marks its job
running in the ledger, runs it (:func:`.execution.execute`) and hands the outcome to
the acker. ``None`` in the inbox stops one thread.
"""

from __future__ import annotations

import logging
import queue as stdlib_queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ...engine import ClaimedJob, JobTimeout
from ...engine.logfields import log
from .async_executor import AsyncExecutor
from .execution import aborted, after_job, execute, fail_held, finished
from .jobrunner import JobRunner
from .middleware import IDLE
from .outcome import failure
from .timelimits import clear_pending, limits_of

logger = logging.getLogger("django_delayq.worker")


@dataclass(kw_only=True, eq=False)
class Executor(JobRunner):
    """The threads running jobs, and the buffer of jobs waiting for one."""

    #: Threads running jobs.
    concurrency: int
    #: Called if a thread dies outside a job (the worker then stops to be restarted).
    on_thread_lost: Callable[[], None]
    #: async def jobs are handed to it (its event loop thread runs them).
    async_executor: AsyncExecutor | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        self._stopping = False
        #: Threads stuck in a job past its hard time limit: not waited for at a stop.
        self.stuck: set[threading.Thread] = set()
        self._inbox: stdlib_queue.SimpleQueue[ClaimedJob | None] = stdlib_queue.SimpleQueue()
        self.threads: list[threading.Thread] = []

    def deliver(self, job: ClaimedJob) -> None:
        """Queue a claimed ``job`` for the next free thread; a job of an ``async def``
        task goes to the event loop instead."""
        if self.async_executor is not None and self.async_executor.accepts(job):
            self.async_executor.submit(job)
        else:
            self._inbox.put(job)

    def start(self) -> None:
        self.threads = [threading.Thread(target=self._loop, name=f"delayq-exec-{i}",
                                         daemon=True) for i in range(self.concurrency)]
        for thread in self.threads:
            thread.start()

    def take_unstarted(self) -> list[ClaimedJob]:
        """Empty the buffer and return the jobs in it."""
        unstarted: list[ClaimedJob] = []
        while True:
            try:
                job = self._inbox.get_nowait()
            except stdlib_queue.Empty:
                return unstarted
            if job is not None:
                unstarted.append(job)

    def stop(self) -> None:
        """Ask every thread to end after its current job."""
        self._stopping = True
        for _ in self.threads:
            self._inbox.put(None)

    def join(self, deadline: float) -> None:
        for thread in self.threads:
            if thread not in self.stuck:
                thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def alive(self) -> int:
        """Threads still able to run jobs."""
        return sum(1 for thread in self.threads
                   if thread.is_alive() and thread not in self.stuck)

    def _loop(self) -> None:
        try:
            self._serve()
        except BaseException:  # logged here, like the thread's end below
            log(logger, logging.ERROR, "executor thread failed", exc_info=True,
                thread_name=threading.current_thread().name, worker=self.name)
        finally:
            for middleware in self.middleware:
                try:
                    middleware.thread_ended()
                except Exception:  # the thread ends either way
                    log(logger, logging.ERROR, "thread_ended hook failed", exc_info=True,
                        middleware=type(middleware).__name__, worker=self.name)
            if not self._stopping:
                log(logger, logging.CRITICAL, "executor thread ended unexpectedly",
                    thread_name=threading.current_thread().name, worker=self.name)

                self.on_thread_lost()

    def _serve(self) -> None:
        me = threading.current_thread()
        last_done: float | None = None  # when this thread's previous job ended
        while True:
            job = self._inbox.get()
            if job is None:
                return
            try:
                last_done = self._run_one(job, me, last_done)
            except BaseException as exc:  # this thread must go on
                log(logger, logging.ERROR, "executor error", exc_info=True, job=job.id,
                    queue=job.queue, task=job.task, worker=self.name)
                fail_held(self.ledger, self.report, job, exc)

    def _run_one(self, job: ClaimedJob, me: threading.Thread, last_done: float | None) -> float:
        """Run ``job`` on this thread and report its outcome; returns when it ended."""
        limit, retry_delay = limits_of(job, self.tasks, self.timeout)
        lease = self.ledger.start(job, me, timeout=limit, grace=self.timeout_grace,
                                  retry_delay=retry_delay)
        if lease is None:
            return time.perf_counter()  # its lease was lost while it waited: not ours now
        self.note_started(job, lease.started_ms)
        began = time.perf_counter()
        try:
            idle = last_done is None or began - last_done > IDLE
            outcome = execute(job, self.tasks, self.name, self.broker,
                              self.middleware, idle=idle, on_finished=lease.on_finished,
                              abort_by=lambda: lease.abort_by)
        except BaseException as exc:  # raised outside the task (a late JobTimeout)
            outcome = failure(job, exc, retry=True)
        outcome = aborted(lease.abort_by, outcome)
        self._shield(job, me)  # an abort may come to any job
        outcome.started_ms = lease.started_ms
        outcome.finished_ms = lease.started_ms + int((time.perf_counter() - began) * 1000)
        after_job(self.after_job, job)
        if self.ledger.finish(job, me):
            # the outcome is this thread's to give (not the watchdog's, at a hard limit)
            try:
                finished(lease.on_finished, outcome)
            finally:
                try:
                    self.report(outcome)
                finally:
                    self.ledger.reported()
        else:
            self.stuck.discard(me)  # failed at its hard limit, and back after all
        return time.perf_counter()

    def _shield(self, job: ClaimedJob, me: threading.Thread) -> None:
        """Make sure no JobTimeout is raised in this thread after its job: none is raised
        once the ledger shields the job, and one raised before is dropped or caught."""
        while True:
            try:
                if self.ledger.shield(job):  # raised in it: maybe still pending
                    clear_pending(me)
                return
            except JobTimeout:
                continue  # delivered before the clear; none can follow it
