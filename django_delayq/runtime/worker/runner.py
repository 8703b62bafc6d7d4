"""The :class:`Worker`: claims jobs in batches, runs them on threads, acks in batches.

A worker is a few parts around one :class:`.ledger.Ledger` of held leases, each part
owning its own state and running on its own thread:

- the *fetcher* (:mod:`.fetcher`) claims jobs for free threads and the buffer;
- the *executors* (:mod:`.executor`, ``concurrency`` threads) run them;
- the *acker* (:mod:`.acks`) sends outcomes in batches;
- the *heartbeat* (:mod:`.heartbeat`) renews leases, reclaims, records liveness;
- the *watchdog* (:mod:`.timelimits`) enforces jobs' time limits.

Code around each job (the Django layer's database connections, signals, traces) is the
worker's :mod:`.middleware`. Everything it needs is given: its :class:`WorkerOptions`,
brokers and task registry; it reads no settings.

``run()`` blocks until :meth:`Worker.request_stop` (or, with ``burst``, until nothing is
due), then stops claiming, hands back claimed jobs that have not started, lets running
jobs finish within the grace period and returns an exit code (:mod:`.exit_codes`).
:meth:`Worker.request_recycle` stops the same way but lets running jobs finish however
long they take (each within its time limit plus grace, when it has one), so a recycle
runs no job twice. Signals are the management command's business, not the worker's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...engine import Broker, ClaimedJob
from ...engine.logfields import log
from ...engine.workers import forget as forget_worker
from ...engine.workers import new_worker_name
from ..backoff import CALL_FAILED
from ..deadlines import Board
from ..registry import TaskRegistry, is_async
from .acks import Acker, by_shard
from .async_executor import AsyncExecutor
from .executor import Executor
from .exit_codes import EXIT_FORCED, EXIT_OK, EXIT_RESTART
from .fetcher import Fetcher
from .heartbeat import Heartbeat
from .ledger import LOOP, THREADS, Ledger
from .middleware import Middleware
from .timelimits import HARD_LIMIT_GRACE, Watchdog

logger = logging.getLogger("django_delayq.worker")

#: Running jobs a worker's record names (the admin's workers table shows them).
MAX_RUNNING_LISTED = 32


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """How a worker runs: the Django layer fills it from its settings and the command's
    options (``django_delayq.worker.worker_options``); seconds unless said otherwise."""

    #: Threads running jobs.
    concurrency: int
    #: async def jobs run at once on the event loop.
    async_concurrency: int
    #: How long a claimed job stays leased; the heartbeat renews running ones.
    lease: float
    #: How long a stop waits for running jobs.
    grace_period: float
    #: The longest an idle worker blocks on its markers.
    block_timeout: float
    #: Jobs claimed beyond the free threads (None: adapts to the jobs' run time).
    prefetch: int | None = None
    #: The time limit of jobs whose task sets none (None: no limit).
    timeout: float | None = None
    #: How long a job may run past its time limit before the process is replaced.
    timeout_grace: float = HARD_LIMIT_GRACE
    #: Run what is due, then stop.
    burst: bool = False


class Worker:
    """Runs jobs of ``queues``, as ``options`` say, with the tasks of ``tasks``."""

    def __init__(
        self,
        queues: Sequence[str],
        *,
        options: WorkerOptions,
        broker: Broker,
        blocking_broker: Broker,
        tasks: TaskRegistry,
        name: str | None = None,
        middleware: Sequence[Middleware] = (),
        board: Board | None = None,
    ) -> None:
        if not queues:
            raise ValueError("a worker serves at least one queue")
        if options.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if options.async_concurrency < 1:
            raise ValueError("async concurrency must be at least 1")
        self.tasks = tasks
        self.queues = list(queues)
        self.options = options
        self.concurrency = options.concurrency
        self.burst = options.burst
        self.lease_ms = int(options.lease * 1000)
        self.grace_period = options.grace_period
        self.broker = broker
        self.name = name or new_worker_name()
        timeout, timeout_grace = options.timeout, options.timeout_grace

        self._stop = threading.Event()
        #: When a stop with a grace period was first asked (None: not yet, or only a
        #: recycle, which lets running jobs finish however long they take).
        self._stop_asked: float | None = None
        self._disabled = False  # no executor thread left: exit to be restarted at once
        self._restart = False  # a thread is stuck: exit to be restarted after the others
        self._recycled = False  # a recycle was asked: exit to be replaced
        self._done = threading.Event()  # running jobs are over: the acker may finish
        self.ledger = Ledger(board)
        self.acker = Acker(broker=self.broker, name=self.name, ledger=self.ledger,
                           done=self._done)
        #: async def tasks run on an event loop thread, beside the executor threads
        self._async = AsyncExecutor(tasks=self.tasks, name=self.name,
                                    broker=broker, middleware=middleware, ledger=self.ledger,
                                    report=self.acker.put,
                                    note_started=self.acker.note_started,
                                    on_loop_lost=self._loop_lost,
                                    concurrency=options.async_concurrency, timeout=timeout,
                                    timeout_grace=timeout_grace)
        serves_async = any(is_async(t) and t.queue_name in self.queues
                           for t in self.tasks.tasks())
        self.executor = Executor(concurrency=self.concurrency, tasks=self.tasks,
                                 name=self.name, broker=broker,
                                 middleware=middleware, ledger=self.ledger,
                                 report=self.acker.put,
                                 note_started=self.acker.note_started,
                                 on_thread_lost=self._thread_lost,
                                 timeout=timeout, timeout_grace=timeout_grace,
                                 async_executor=self._async if serves_async else None)
        self.watchdog = Watchdog(ledger=self.ledger, name=self.name,
                                 grace=timeout_grace, report=self.acker.put,
                                 on_stuck=self._thread_stuck, done=self._done,
                                 loop_stalled_for=self._async.stalled_for
                                 if serves_async else None,
                                 on_loop_stalled=self._loop_stalled)
        # The queues whose tasks are all async def are claimed for the event loop's
        # slots (its lane), the others for the threads: each lane claims only what it
        # can run, whatever the mix of the two kinds.
        loop_queues = [q for q in self.queues if self.tasks.only_async(q)]
        slots = self._async.concurrency
        lanes = [(THREADS, [q for q in self.queues if q not in loop_queues],
                  self.concurrency, options.prefetch, 1, 0),
                 (LOOP, loop_queues, slots, 0, max(1, slots // 2), slots)]
        #: Per lane, the ledger's settles when its fetcher last found its queues empty.
        self._burst_idle: dict[str, int] = {}
        self.fetchers = [
            Fetcher(broker=self.broker, blocking_broker=blocking_broker, queues=lane_queues,
                    name=self.name, lease_ms=self.lease_ms,
                    block_timeout=options.block_timeout, concurrency=lane_concurrency,
                    prefetch=lane_prefetch, burst=self.burst,
                    ledger=self.ledger, deliver=self.executor.deliver, stop=self._stop,
                    on_burst_done=self._burst_lane_done, lane=lane, min_batch=min_batch,
                    ack_room=ack_room,
                    held_back=(lambda: self._async.stalled_for() > 0) if lane == LOOP
                    else (lambda: False))
            for lane, lane_queues, lane_concurrency, lane_prefetch, min_batch, ack_room in lanes
            if lane_queues]
        #: The fetcher of the threads' lane (of the loop's if every queue is async).
        self.fetcher = self.fetchers[0]
        self.heartbeat = Heartbeat(broker=self.broker, name=self.name, lease_ms=self.lease_ms,
                                   shards=[k for f in self.fetchers for k in f.shards],
                                   ledger=self.ledger, done=self._done, info=self._info)

    # -- control (also the process pool's hooks) ----------------------------------

    def request_stop(self) -> None:
        """Stop claiming; ``run()`` then hands back the buffer, lets running jobs finish
        within the grace period and returns. Safe to call from any thread, any time
        (during a recycle, the grace period starts now)."""
        if self._stop_asked is None:
            self._stop_asked = time.monotonic()
        self._halt()

    def request_recycle(self) -> None:
        """Stop claiming and hand back the buffer, as :meth:`request_stop` does, but let
        running jobs finish however long they take (each is bounded by its time limit
        plus grace when it has one): a recycle runs no job twice. ``run()`` then
        returns :data:`EXIT_RESTART` (unless a stop was asked too)."""
        self._recycled = True
        self._halt()

    def _halt(self) -> None:
        if not self._stop.is_set():
            log(logger, logging.INFO, "worker stopping", worker=self.name)
        self._stop.set()
        with self.ledger.changed:
            self.ledger.changed.notify_all()

    def _thread_lost(self) -> None:
        """An executor thread ended by itself; with none left, stop and be restarted."""
        if self.executor.alive() > 1:  # the caller is still alive as it calls this
            return
        log(logger, logging.CRITICAL, "no executor thread left: handing back every job and "
            "exiting to be restarted", worker=self.name)
        self._disabled = True
        self.request_stop()

    def _loop_lost(self) -> None:
        """The event loop thread died: its async jobs cannot end, so stop and be
        restarted (their leases lapse, or are handed back as the worker stops)."""
        self._restart = True
        self.request_stop()

    def _burst_lane_done(self, lane: str, settles: int) -> bool:
        """``lane``'s fetcher found its queues empty after the ledger's ``settles``-th
        settle, with no job held: the burst ends (True) once every lane has, after the
        same last settle; until then the lane waits and looks again."""
        with self.ledger.lock:
            self._burst_idle[lane] = settles
            done = (not self.ledger.held_count
                    and all(self._burst_idle.get(f.lane) == self.ledger.settles
                            for f in self.fetchers))
        if done:
            log(logger, logging.INFO, "burst done", worker=self.name)
            self.request_stop()
        return done

    def _loop_stalled(self, stalled_for: float) -> None:
        """The event loop ran nothing for ``stalled_for`` seconds: hand back the jobs
        waiting for its slots, so that other workers run them (its fetcher claims
        nothing until it runs again)."""
        jobs = self.ledger.withdraw_unstarted(self._async.waiting())
        log(logger, logging.ERROR, "event loop stalled (a coroutine blocks it): handing back "
            "its waiting async jobs", stalled_s=round(stalled_for, 1), jobs=len(jobs),
            worker=self.name)
        if jobs:
            self._release(jobs, started=False, settle=False)

    def _thread_stuck(self, thread: threading.Thread) -> None:
        """A job overran its hard time limit: its thread cannot be stopped, so this
        process stops (the others' jobs get the grace period) to be restarted."""
        self.executor.stuck.add(thread)
        self._restart = True
        self.request_stop()

    @property
    def after_job(self) -> Callable[[], None] | None:
        """Called as each job ends, before the fetcher hears of the free slot (the
        process pool's recycling counts jobs with it)."""
        return self.executor.after_job

    @after_job.setter
    def after_job(self, hook: Callable[[], None] | None) -> None:
        self.executor.after_job = hook
        self._async.after_job = hook

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def jobs_finished(self) -> int:
        """Jobs whose run ended on this worker's threads so far (whatever the outcome)."""
        return self.ledger.finished_count

    @property
    def processed(self) -> int:
        """Jobs completed (acked)."""
        return self.acker.completed

    @property
    def failed(self) -> int:
        """Jobs failed for good (dead-lettered; not the attempts to be retried)."""
        return self.acker.failed

    # -- running ------------------------------------------------------------------

    def run(self, *, keep_record: bool = False) -> int:
        """Run until stopped; returns an exit code of :mod:`.exit_codes`.

        The worker then leaves the workers alive, unless ``keep_record``: its record is
        then written once more and kept until the caller calls :meth:`forget` (a
        ``runworker`` whose mirror process, consuming under this worker's name, still
        writes what is left: until then other mirrors must not take its events over).
        """
        log(logger, logging.INFO, "worker started", worker=self.name,
            queues=",".join(self.queues), concurrency=self.concurrency)
        self._register_queues()
        if self.burst:
            # A burst run may end before its first heartbeat: reclaim dead workers' expired
            # leases now, so their jobs run in this burst (and once more before exiting).
            self._reclaim()
        self.executor.start()
        if self.executor.async_executor is not None:
            self._async.start()
        acker = threading.Thread(target=self.acker.run, name="delayq-acker", daemon=True)
        heartbeat = threading.Thread(target=self.heartbeat.run, name="delayq-heartbeat",
                                     daemon=True)
        fetchers = [threading.Thread(target=f.run, name=f"delayq-fetcher-{f.lane}", daemon=True)
                    for f in self.fetchers]
        watchdog = threading.Thread(target=self.watchdog.run, name="delayq-watchdog",
                                    daemon=True)
        threads = [acker, heartbeat, *fetchers, watchdog]
        for thread in threads:
            thread.start()
        self._stop.wait()
        for each in self.fetchers:
            each.wake()
        for fetcher in fetchers:
            fetcher.join()
        code = self._shutdown()
        self._done.set()
        self.acker.wake()
        acker.join(timeout=10)
        heartbeat.join(timeout=10)
        self._async.stop(wait=not self._restart)  # a stuck coroutine may block the loop
        if self.burst:
            self._reclaim()
        if keep_record:
            self._register_queues()  # a fresh heartbeat for the time the caller needs
        else:
            self.forget()
        counts = self.acker
        log(logger, logging.INFO, "worker stopped", worker=self.name,
            jobs=counts.completed + counts.retried + counts.failed + counts.cancelled,
            completed=counts.completed, retried=counts.retried, failed=counts.failed,
            aborted=counts.cancelled, exit_code=code)
        return code

    def _shutdown(self) -> int:
        """Hand back unstarted jobs, give running ones the grace period, flush acks."""
        self.executor.take_unstarted()
        self.executor.stop()
        unstarted = self.ledger.withdraw_unstarted()
        if unstarted:
            self._release(unstarted, started=False, settle=False)
        over = self._let_running_finish()  # their outcomes with the acker too
        self.executor.join(time.monotonic() + (1.0 if over else 0.0))
        self.acker.flush_until_done(time.monotonic() + 5)
        leftover = [lease.job for lease in self.ledger.running()]
        if leftover:
            log(logger, logging.WARNING, "no thread runs them, handing back running jobs"
                if self._disabled else "grace period over, handing back running jobs",
                jobs=len(leftover), worker=self.name)
            self._release(leftover, started=True)
        if self._disabled or self._restart:
            return EXIT_RESTART
        if leftover:
            return EXIT_FORCED
        return EXIT_RESTART if self._recycled and self._stop_asked is None else EXIT_OK

    def _let_running_finish(self) -> bool:
        """Wait for the running jobs and their outcomes: until the grace period ends (it
        starts when the stop was asked, or now if later), or, for a recycle, until they
        are over. Returns whether they are."""
        began = time.monotonic()

        def deadline() -> float | None:
            if self._disabled:
                return began
            asked = self._stop_asked
            return None if asked is None else max(began, asked) + self.grace_period

        while True:
            until = deadline()
            wait = 1.0 if until is None else min(1.0, until - time.monotonic())

            def moved(until: float | None = until) -> bool:
                return deadline() != until  # a signal during a recycle: a grace period now

            # re-checked at least every second: a thread may die with its job
            if self.ledger.wait_running(max(0.0, wait), until=moved):
                return True
            if wait <= 0:
                return False

    def forget(self) -> None:
        """Leave the workers alive (:meth:`run` does as it returns, unless told not to)."""
        forget_worker(self.broker, self.name)

    def _register_queues(self) -> None:
        """Record this worker alive, and the queues it serves as known."""
        try:
            self.heartbeat.record_alive()
        except CALL_FAILED as exc:
            log(logger, logging.WARNING, "could not register worker", worker=self.name,
                error=exc)

    def _reclaim(self) -> None:
        """One heartbeat without lease renewal: reclaim expired leases, record alive
        (what fails is logged: the burst runs on)."""
        try:
            self.heartbeat.beat(renew=False)
        except CALL_FAILED as exc:
            log(logger, logging.WARNING, "reclaim failed", worker=self.name, error=exc)
        except Exception:
            log(logger, logging.ERROR, "reclaim failed", exc_info=True, worker=self.name)

    def _info(self) -> dict[str, Any]:
        """What the workers-alive registry shows of this worker."""
        return {"queues": ",".join(self.queues), "concurrency": self.concurrency,
                "processed": self.processed, "failed": self.failed,
                "retried": self.acker.retried, "busy": self.ledger.busy,
                # the job each thread (or loop slot) runs, for the admin's workers table
                "running": " ".join(f"{lease.job.queue}/{lease.job.id}"
                                    for lease in self.ledger.running()[:MAX_RUNNING_LISTED]),
                # delayq_health: a worker with no live executor thread is not healthy
                # (before run() starts them, the threads about to start), nor one whose
                # event loop stalled
                "threads": self.executor.alive() if self.executor.threads
                else self.concurrency, "lease": self.lease_ms / 1000,
                "loop_stalled": round(self._async.stalled_for(), 1)}

    def _release(self, jobs: list[ClaimedJob], *, started: bool, settle: bool = True) -> None:
        batch = self.broker.batch()
        for keys, pairs in by_shard(jobs).items():
            self.broker.add_release(batch, keys, pairs, started=started)
        try:
            batch.run()
        except CALL_FAILED as exc:
            log(logger, logging.WARNING, "could not hand back jobs (their leases will lapse)",
                jobs=len(jobs), worker=self.name, error=exc)
            return
        if settle:
            self.ledger.settle(jobs)
        log(logger, logging.INFO, "handed back jobs", jobs=len(jobs), worker=self.name)

