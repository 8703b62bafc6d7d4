"""``async def`` tasks: run on one event loop thread per worker process.

A worker thread that takes a job of an async task hands it to the
:class:`AsyncExecutor` and goes back to its queue at once: async jobs do not hold
threads. At most ``concurrency`` of them (``DELAYQ["ASYNC_CONCURRENCY"]``, ``runworker
--async-concurrency``) run at once. Each runs under ``asyncio.timeout`` when it has a
time limit: at the limit it is cancelled and fails with
:class:`~django_delayq.engine.errors.JobTimeout` (a coroutine that swallows the
cancellation keeps running, and its lease is handed back at the stop like any job that
overruns the grace period). Outcomes go to the same acker as threaded jobs.

Django's async-safety rules apply: the ORM is reached through ``sync_to_async`` (a
direct call raises ``SynchronousOnlyOperation``). Django's connections of the
thread-sensitive thread that ``sync_to_async`` uses are checked before and after each
job (``close_old_connections``), as a worker thread does around its jobs.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections

from ..conf import conf
from ..current import running
from ..engine import ClaimedJob, UnknownTask, encode_result
from ..engine.errors import JobTimeout
from ..task import Task, TaskRegistry
from .execution import CorruptPayload, Outcome, decode_arguments, failure

logger = logging.getLogger("django_delayq.worker")


def is_async(task: Task[Any, Any]) -> bool:
    """Whether ``task`` is an ``async def`` function (run on the event loop)."""
    return inspect.iscoroutinefunction(task.func)


def time_limit(job: ClaimedJob) -> float | None:
    """Seconds ``job`` may run: its own limit when the job carries one, else
    ``DELAYQ["TIMEOUT"]`` (None: no limit)."""
    return job.timeout_ms / 1000 if job.timeout_ms > 0 else conf.TIMEOUT


class AsyncExecutor:
    """The event loop thread of a worker process and the async jobs it runs."""

    def __init__(self, tasks: TaskRegistry, encoder: type[json.JSONEncoder], worker: str,
                 concurrency: int | None = None) -> None:
        self.tasks = tasks
        self.encoder = encoder
        self.worker = worker
        self.concurrency = concurrency or conf.ASYNC_CONCURRENCY
        if self.concurrency < 1:
            raise ValueError("async concurrency must be at least 1")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._slots: asyncio.Semaphore | None = None
        self._started = threading.Lock()
        self._idle = threading.Condition()
        self._in_flight = 0

    def accepts(self, job: ClaimedJob) -> bool:
        """Whether ``job`` is a job of a registered async task."""
        try:
            return bool(job.task) and is_async(self.tasks.get(job.task))
        except UnknownTask:
            return False  # the threaded path fails it with its usual error

    def submit(self, job: ClaimedJob, on_done: Callable[[Outcome], None]) -> None:
        """Run ``job`` on the loop; ``on_done(outcome)`` is called on the loop thread."""
        loop = self._ensure_loop()
        with self._idle:
            self._in_flight += 1
        asyncio.run_coroutine_threadsafe(self._run(job, on_done), loop)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def wait_idle(self, deadline: float) -> bool:
        """Wait (at most until ``deadline``, monotonic) for every async job to end."""
        with self._idle:
            return self._idle.wait_for(lambda: self._in_flight == 0,
                                       timeout=max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        """Stop the loop thread (jobs still running on it are abandoned)."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._started:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    self._slots = asyncio.Semaphore(self.concurrency)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=run, name="delayq-async", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    async def _run(self, job: ClaimedJob, on_done: Callable[[Outcome], None]) -> None:
        assert self._slots is not None
        try:
            async with self._slots:
                outcome = await self._outcome(job)
        except BaseException as exc:  # whatever a coroutine raises, its job gets an outcome
            outcome = failure(job, exc, retry=True)
        try:
            on_done(outcome)
        finally:
            with self._idle:
                self._in_flight -= 1
                self._idle.notify_all()

    async def _outcome(self, job: ClaimedJob) -> Outcome:
        """Run ``job``'s coroutine and turn what happened into an :class:`Outcome`."""
        task = self.tasks.get(job.task)
        try:
            args, kwargs = decode_arguments(job)
        except CorruptPayload as exc:
            return failure(job, exc, retry=False)
        limit = time_limit(job)
        await sync_to_async(close_old_connections)()
        try:
            with running(job, self.worker):
                async with asyncio.timeout(limit) as scope:
                    coroutine: Coroutine[Any, Any, Any] = task.func(*args, **kwargs)
                    value = await coroutine
        except TimeoutError as exc:
            if not scope.expired():
                return failure(job, exc, retry=True, delay=task.retry_delay(job.attempt))
            return failure(job, JobTimeout(f"the job ran past its time limit of {limit}s"),
                           retry=True, delay=task.retry_delay(job.attempt))
        except Exception as exc:
            return failure(job, exc, retry=True, delay=task.retry_delay(job.attempt))
        finally:
            await sync_to_async(close_old_connections)()
        try:
            result_json = encode_result(value, self.encoder)
        except TypeError as exc:
            return failure(job, exc, retry=False)
        return Outcome(job, True, result_json=result_json)
