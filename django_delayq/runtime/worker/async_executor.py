"""``async def`` tasks: run on one event loop thread per worker process.

Jobs of queues whose tasks are all ``async def`` are claimed by the worker's loop lane
(:mod:`.fetcher`) only as the loop has free slots, and handed here directly; an async job
of a queue that mixes both kinds reaches it through a worker thread, which goes back to
its queue at once: async jobs do not hold threads. At most ``concurrency`` of them
(``DELAYQ["ASYNC_CONCURRENCY"]``, ``runworker --async-concurrency``) run at once; one
waiting for a slot is still buffered (not started, its time limit not yet running).
Outcomes go to the same acker as threaded jobs.

The loop starts with the worker (:meth:`AsyncExecutor.start`), never on demand: a job
handed over while it was still starting must not be taken for one handed to a dead loop.
A loop that runs none of its callbacks for :data:`LOOP_STALL` seconds (a coroutine
blocking it) is *stalled*: the worker's heartbeat record and ``delayq_health`` say so,
its fetcher claims nothing, and the jobs waiting for one of its slots are handed back
(:meth:`AsyncExecutor.waiting`) so that other workers run them.

Time limits follow the threaded rules (:mod:`.timelimits`), with the same limit (the
job's, its task's, ``runworker --timeout``, ``DELAYQ["TIMEOUT"]``): at the limit the
coroutine is cancelled (``asyncio.timeout``) and its job fails with
:class:`~django_delayq.engine.errors.JobTimeout`. A cancellation is delivered at the
coroutine's next ``await``, so a coroutine that blocks the loop (a ``time.sleep``) or
swallows ``CancelledError`` runs on; the watchdog then fails it at the hard limit (limit
plus grace) and the process stops to be replaced, as for a thread, and its lease is
never renewed past that point. The loop thread is the thread of its jobs' leases: if it
dies, their leases lapse, and the worker stops claiming, hands back what it holds and
exits to be restarted.

Code around each job runs through the worker's middleware
(:mod:`.middleware`), on the loop: the Django layer checks its database connections of
the thread ``sync_to_async`` uses there, whenever that thread may hold one. The job's
``on_finished`` hooks (the Tasks backend's ``task_finished``) run through
``sync_to_async``, off the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async

from ...engine import ClaimedJob, UnknownTask, encode_result
from ...engine.errors import JobAborted, JobTimeout
from ...engine.logfields import log
from ..current import running
from ..registry import is_async
from .execution import aborted, after_job, end_a_fork, fail_held, finished
from .jobrunner import JobRunner
from .ledger import Lease
from .middleware import IDLE
from .outcome import CorruptPayload, Outcome, decode_arguments, failure
from .timelimits import limits_of

logger = logging.getLogger("django_delayq.worker")

#: Seconds between two ticks of the loop's clock (a callback that notes the time).
LOOP_TICK = 0.5
#: A loop that ran no tick for this long (seconds) is stalled.
LOOP_STALL = 10.0


@dataclass(kw_only=True, eq=False)
class AsyncExecutor(JobRunner):
    """The event loop thread of a worker process and the async jobs it runs."""

    #: Called if the loop thread dies (the worker then stops to be restarted).
    on_loop_lost: Callable[[], None]
    #: Async jobs running at once, at most.
    concurrency: int

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.concurrency < 1:
            raise ValueError("async concurrency must be at least 1")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._slots: asyncio.Semaphore | None = None
        self._started = threading.Lock()
        self._stopping = False
        #: When the loop last ran its tick (``time.monotonic()``).
        self._ticked = 0.0
        #: When the last async job ended (monotonic seconds): a middleware is told
        #: whether the loop idled before the next one.
        self._last_done = float("-inf")
        #: Jobs handed over that have no slot yet, by id (the loop's view of its buffer).
        self._waiting: dict[tuple[Any, str, int], ClaimedJob] = {}
        self._waiting_lock = threading.Lock()
        #: Jobs handed over that the loop has not taken yet (under ``_waiting_lock``),
        #: and the loop's tasks running jobs.
        self._handed: list[ClaimedJob] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def accepts(self, job: ClaimedJob) -> bool:
        """Whether ``job`` is a job of a registered async task."""
        try:
            return bool(job.task) and is_async(self.tasks.get(job.task))
        except UnknownTask:
            return False  # the threaded path fails it with its usual error

    def alive(self) -> bool:
        """Whether the loop can run jobs (not started yet counts: it starts on demand)."""
        return self._thread is None or self._thread.is_alive()

    def start(self) -> None:
        """Start the loop thread (the worker does before it claims)."""
        self._ensure_loop()

    def stalled_for(self) -> float:
        """Seconds the loop has run no callback past its tick (0: it runs, or never
        started)."""
        if self._loop is None or self._stopping or not self.alive():
            return 0.0
        late = time.monotonic() - self._ticked - LOOP_TICK
        return late if late >= LOOP_STALL else 0.0

    def waiting(self) -> list[ClaimedJob]:
        """The jobs handed over that have not got a slot yet."""
        with self._waiting_lock:
            return list(self._waiting.values())

    def submit(self, job: ClaimedJob) -> None:
        """Run ``job`` on the loop once a slot is free. On a dead loop it stays
        buffered, to be handed back (unattempted) as the worker stops.

        Jobs handed over while the loop has not yet taken the ones before are taken
        with them, on one wake-up of the loop (a claim's batch costs one, not one a
        job)."""
        loop = self._ensure_loop()  # started and running once this returns
        if self._stopping or not self.alive():
            return
        with self._waiting_lock:
            self._waiting[(job.keys, job.id, job.attempt)] = job
            self._handed.append(job)
            wake = len(self._handed) == 1
        if wake:
            loop.call_soon_threadsafe(self._take_handed)

    def _take_handed(self) -> None:
        """On the loop: a task for each job handed over since the last call."""
        with self._waiting_lock:
            jobs, self._handed = self._handed, []
        assert self._loop is not None
        for job in jobs:
            task = self._loop.create_task(self._run(job))
            self._tasks.add(task)  # the loop keeps only a weak reference
            task.add_done_callback(functools.partial(self._ran, job))

    def _ran(self, job: ClaimedJob, future: asyncio.Task[None]) -> None:
        """The run of ``job`` on the loop is over. Whatever the task raises is its
        outcome; what raised here is this code's, before the job started or after it
        ended: logged, and the job failed if it is still held without an outcome."""
        self._tasks.discard(future)
        with self._waiting_lock:
            self._waiting.pop((job.keys, job.id, job.attempt), None)
        if future.cancelled():
            if self._stopping:
                return  # the worker hands back what it holds as it stops
            exc: BaseException = asyncio.CancelledError("its run on the event loop was "
                                                        "cancelled")
        else:
            error = future.exception()
            if error is None:
                return
            exc = error
        log(logger, logging.ERROR, "async job run failed", exc_info=exc, job=job.id,
            queue=job.queue, task=job.task, worker=self.name)
        fail_held(self.ledger, self.report, job, exc)

    def stop(self, *, wait: bool = True) -> None:
        """Stop the loop thread (jobs still running on it are abandoned); ``wait=False``
        does not wait for a loop that a coroutine blocks."""
        self._stopping = True
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:
                return  # closed meanwhile: its thread has ended
            if wait:
                self._thread.join(timeout=5)

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._started:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def tick() -> None:
                    self._ticked = time.monotonic()
                    loop.call_later(LOOP_TICK, tick)

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    self._slots = asyncio.Semaphore(self.concurrency)
                    loop.call_soon(tick)
                    loop.call_soon(ready.set)
                    try:
                        loop.run_forever()
                    except BaseException:  # a SystemExit from a callback ends the loop
                        log(logger, logging.ERROR, "event loop failed", exc_info=True,
                            worker=self.name)
                    finally:
                        if not self._stopping:
                            log(logger, logging.CRITICAL, "event loop thread ended "
                                "unexpectedly: its async jobs cannot finish", worker=self.name)
                            self.on_loop_lost()
                        elif not asyncio.all_tasks(loop):
                            # its selector and self-pipe are freed now, not when the
                            # process ends: a worker in a thread (tests, the Tasks
                            # backend's) leaks nothing. Abandoned jobs keep it open:
                            # cancelling them would report outcomes for handed-back jobs.
                            loop.close()

                self._thread = threading.Thread(target=run, name="delayq-async", daemon=True)
                self._thread.start()
                ready.wait()
                self._loop = loop
            return self._loop

    async def _run(self, job: ClaimedJob) -> None:
        assert self._slots is not None
        assert self._thread is not None
        me = self._thread
        limit, retry_delay = limits_of(job, self.tasks, self.timeout)
        async with self._slots:
            with self._waiting_lock:
                self._waiting.pop((job.keys, job.id, job.attempt), None)
            # started once it has a slot: its time limit runs from here
            lease = self.ledger.start(job, me, timeout=limit, grace=self.timeout_grace,
                                      retry_delay=retry_delay, on_loop=True)
            if lease is None:
                return  # handed back, or its lease was lost, while it waited
            self.note_started(job, lease.started_ms)
            began = time.perf_counter()
            try:
                outcome = await self._outcome(job, limit, lease)
            except GeneratorExit:
                raise  # the task is being closed (its loop is gone): no await, no outcome
            except BaseException as exc:  # whatever a coroutine raises, its job gets an outcome
                outcome = failure(job, exc, retry=True)
            finally:
                lease.cancel = None
        outcome = aborted(lease.abort_by, outcome)
        outcome.started_ms = lease.started_ms
        outcome.finished_ms = lease.started_ms + int((time.perf_counter() - began) * 1000)
        after_job(self.after_job, job)
        if not self.ledger.finish(job, me):
            return  # failed by the watchdog at its hard limit: that outcome stands
        try:
            if lease.on_finished:
                # receivers are sync code: off the loop, as Django's Signal.asend runs them
                await sync_to_async(finished)(lease.on_finished, outcome)
        finally:
            try:
                self.report(outcome)
            finally:
                self.ledger.reported()

    async def _outcome(self, job: ClaimedJob, limit: float | None, lease: Lease) -> Outcome:
        """Run ``job``'s coroutine and turn what happened into an :class:`Outcome`."""
        task = self.tasks.get(job.task)
        if lease.abort_by is not None:  # asked to stop before it ran
            return failure(job, JobAborted(f"aborted by {lease.abort_by}"), retry=False)
        try:
            args, kwargs = decode_arguments(job)
        except CorruptPayload as exc:
            return failure(job, exc, retry=False)
        idle = time.monotonic() - self._last_done > IDLE
        try:
            for each in self.middleware:
                await each.before_async_job(job, idle=idle)
        except BaseException as exc:  # the job did not run: retried
            return failure(job, exc, retry=True)
        outcome: Outcome | None = None
        me = asyncio.current_task()
        if me is not None:  # how an abort stops it (Ledger.interrupt)
            lease.cancel = functools.partial(asyncio.get_running_loop().call_soon_threadsafe,
                                             me.cancel)
        pid = os.getpid()
        try:
            with running(job, self.name, self.broker, lease.on_finished,
                         lambda: lease.abort_by):
                async with asyncio.timeout(limit) as scope:
                    coroutine: Coroutine[Any, Any, Any] = task.func(*args, **kwargs)
                    try:
                        value = await coroutine
                    except BaseException as exc:
                        end_a_fork(pid, exc)
                        raise
                    end_a_fork(pid)
        except TimeoutError as exc:
            error = exc if not scope.expired() else JobTimeout(
                f"the job ran past its time limit of {limit}s")
            outcome = failure(job, error, retry=True, delay=task.retry_delay(job.attempt))
        except GeneratorExit as exc:
            if self._stopping:
                raise  # thrown in by the close of a task its stopped loop left behind
            outcome = failure(job, exc, retry=True, delay=task.retry_delay(job.attempt))
        except BaseException as exc:  # KeyboardInterrupt, CancelledError... fail the job
            if isinstance(exc, asyncio.CancelledError) and lease.interrupted and me:
                me.uncancel()  # the abort's own cancellation: consumed here
            outcome = failure(job, exc, retry=True, delay=task.retry_delay(job.attempt))
        if outcome is None:
            try:
                outcome = Outcome(job, True, result_json=encode_result(
                    value, limit=self.broker.config.result_max_bytes))
            except BaseException as exc:  # a value whose encoding raises anything
                outcome = failure(job, exc, retry=False)
        self._last_done = time.monotonic()
        outcome = aborted(lease.abort_by, outcome)  # what the middleware sees
        for each in reversed(self.middleware):
            try:
                await each.after_async_job(job, outcome)
            except BaseException:
                log(logger, logging.ERROR, "middleware failed after the job", exc_info=True,
                    job=job.id, queue=job.queue, task=job.task, worker=self.name)

        return outcome
