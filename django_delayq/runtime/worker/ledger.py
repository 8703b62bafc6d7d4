"""The ledger of leases a worker holds: the one state its threads share.

Every claimed job is in the ledger from its claim until its ack lands (or it is handed
back, or its lease is found lost). A lease is *buffered* (claimed, waiting for a
thread), *running* (a thread, or the event loop thread for an ``async def`` task, runs
it) or *finished* (ran, its ack not yet confirmed). The fetcher adds leases, executors
start and finish them, the acker settles them, the heartbeat renews what
:meth:`Ledger.renewable` lists. One lock guards it all; its condition wakes the fetcher
when room frees up.

Every lease counts against the worker's capacity until it leaves the ledger, finished
ones included: a worker never holds more than ``concurrency + prefetch`` (plus its async
slots) unacked jobs, which bounds what one SIGKILL can make run twice. Each lease belongs
to the *lane* that claimed it (:data:`THREADS`, or :data:`LOOP` for the queues whose
tasks are all ``async def``), and each lane's fetcher counts only its own.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ...engine import ClaimedJob, QueueKeys
from ..deadlines import Board

BUFFERED = "buffered"
RUNNING = "running"
FINISHED = "finished"

#: A lease: its job's shard, id and attempt. A job retried at once can be claimed again
#: by the same worker before its last attempt's ack is settled: both are held then.
Key = tuple[QueueKeys, str, int]

#: The lanes of a worker: jobs claimed for its threads, and for its event loop.
THREADS = "threads"
LOOP = "loop"

#: Seconds a job asked to stop (``Job.abort()``) has to see ``abort_requested`` and stop
#: by itself before JobAborted is raised in it (or it is cancelled, on the loop).
ABORT_NOTICE = 1.0


@dataclass(slots=True)
class Lease:
    """One held job and where it stands."""

    job: ClaimedJob
    state: str = BUFFERED
    #: The lane that claimed it (:data:`THREADS` or :data:`LOOP`).
    lane: str = THREADS
    #: The thread running it (while ``running``): an executor thread, or the event loop
    #: thread for an async job.
    thread: threading.Thread | None = None
    #: An async job on the event loop: its soft limit is a cancellation on the loop,
    #: never an exception raised in the (shared) loop thread.
    on_loop: bool = False
    #: When it was claimed and when it started running (``time.monotonic()``), and its
    #: start on the Redis clock (estimated from the claim's Redis time).
    claimed: float = 0.0
    began: float = 0.0
    started_ms: int = 0
    #: Its time limit in seconds (None: none), the monotonic time it is reached, and
    #: the time past which its lease is no longer renewed (the limit plus the grace).
    timeout: float | None = None
    limit_at: float | None = None
    renew_until: float | None = None
    #: The delay of its retry should it overrun its limit, and its record on the
    #: process's deadline board (None: not posted).
    retry_delay: float = 1.0
    slot: int | None = None
    #: Set once JobTimeout was raised in its thread, or once its thread is done with
    #: the task (no JobTimeout may be raised in it any more).
    interrupted: bool = False
    shielded: bool = False
    #: The engine said another attempt owns the job now: not renewed any more (its
    #: outcome is still sent, and ignored as stale).
    lost: bool = False
    #: Who asked for its abort (None: nobody): its limit is then now, its hard limit
    #: ``grace`` seconds later (:meth:`Ledger.request_abort`).
    abort_by: str | None = None
    grace: float = 0.0
    #: Cancels an async job's task on its loop (set while its coroutine runs).
    cancel: Callable[[], Any] | None = None
    #: Called with the job's final outcome by whoever ends it (its thread, or the
    #: watchdog at the hard limit): the Tasks backend's ``task_finished``.
    on_finished: list[Callable[[Any], None]] = field(default_factory=list)


def key(job: ClaimedJob) -> Key:
    return (job.keys, job.id, job.attempt)


def _renewable(lease: Lease, now: float) -> bool:
    if lease.lost:
        return False
    if lease.state != RUNNING:
        return True
    thread = lease.thread
    return (thread is not None and thread.is_alive()
            and (lease.renew_until is None or now < lease.renew_until))


class Ledger:
    """The leases held by one worker (thread-safe)."""

    def __init__(self, board: Board | None = None) -> None:
        #: Where running jobs with a time limit are posted for the host to watch.
        self.board = board
        self.lock = threading.Lock()
        #: Notified when a lease finishes or the worker stops: the fetcher waits on it.
        self.changed = threading.Condition(self.lock)
        self._leases: dict[Key, Lease] = {}
        self._busy = 0  # buffered or running
        #: Per lane: leases held, and those of them buffered or running.
        self._held_in: dict[str, int] = {THREADS: 0, LOOP: 0}
        self._busy_in: dict[str, int] = {THREADS: 0, LOOP: 0}
        self._reporting = 0  # finished by their thread, outcome not yet with the acker
        #: Per lane, the moving average of job run time in seconds (the fetcher sizes
        #: prefetch with it); None until a job has run.
        self.avg_run_time: dict[str, float | None] = {THREADS: None, LOOP: None}
        #: Jobs whose run ended on a thread of this worker (the pool recycles on it).
        self.finished_count = 0
        #: Jobs the fetchers may still claim (None: no limit). A worker recycled after
        #: N jobs claims N in all, so it runs no more; a claimed job that goes back
        #: unstarted gives its place back.
        self.budget: int | None = None
        #: Called under the lock as a job finishes: whether to wake the fetchers (they
        #: claim in batches, so they need not wake for every job); one per fetcher.
        self.wake_fetcher: list[Callable[[], bool]] = []

    @property
    def busy(self) -> int:
        """Leases claimed and not yet finished running (buffered or running)."""
        return self._busy

    def busy_in(self, lane: str) -> int:
        """Leases of ``lane`` claimed and not yet finished running."""
        return self._busy_in[lane]

    def held_in(self, lane: str) -> int:
        """Leases of ``lane`` held (what its fetcher counts against its capacity)."""
        return self._held_in[lane]

    #: Calls of :meth:`settle` so far: a burst's lanes look again at their queues after
    #: each (an ack can release a dependant, or a retry, into any lane's queue).
    settles: int = 0

    @property
    def held_count(self) -> int:
        """Leases held: buffered, running, and finished with their ack on its way (what
        the fetcher counts against the worker's capacity)."""
        return len(self._leases)

    def __contains__(self, item: Key) -> bool:
        return item in self._leases

    def add(self, jobs: Iterable[ClaimedJob], lane: str = THREADS) -> None:
        """Hold newly claimed ``jobs`` (buffered), claimed by ``lane``."""
        with self.lock:
            now = time.monotonic()
            for job in jobs:
                self._leases[key(job)] = Lease(job, lane=lane, claimed=now)
                self._busy += 1
                self._busy_in[lane] += 1
                self._held_in[lane] += 1

    def _done_running(self, lease: Lease) -> None:
        """``lease`` is no longer buffered or running (call under the lock)."""
        self._busy -= 1
        self._busy_in[lease.lane] -= 1
        if lease.slot is not None and self.board is not None:
            self.board.clear(lease.slot)
            lease.slot = None

    def _drop(self, k: Key) -> Lease:
        """Forget the lease of ``k`` (call under the lock; its busy count apart)."""
        lease = self._leases.pop(k)
        self._held_in[lease.lane] -= 1
        if lease.state == BUFFERED:
            self.refund(1)
        return lease

    def refund(self, jobs: int) -> None:
        """Give ``jobs`` places back to the claim budget (call under the lock)."""
        if self.budget is not None:
            self.budget += jobs

    def _wake(self) -> None:
        """Wake the fetchers if one of them wants it (call under the lock)."""
        if any(wants() for wants in self.wake_fetcher):
            self.changed.notify_all()

    def start(self, job: ClaimedJob, thread: threading.Thread, *, timeout: float | None,
              grace: float, retry_delay: float = 1.0, on_loop: bool = False) -> Lease | None:
        """Mark ``job`` running on ``thread``; None if its lease was lost meanwhile
        (another worker owns the job now: it must not run here) or it was handed back.
        It is posted on the board, with its limit and ``retry_delay``."""
        now = time.monotonic()
        with self.lock:
            lease = self._leases.get(key(job))
            if lease is None or lease.state != BUFFERED:
                return None
            lease.state, lease.thread, lease.began = RUNNING, thread, now
            lease.on_loop = on_loop
            lease.started_ms = job.started_at_ms + int((now - lease.claimed) * 1000)
            lease.grace = grace
            if timeout is not None:
                lease.timeout, lease.limit_at = timeout, now + timeout
                lease.renew_until = now + timeout + grace
                lease.retry_delay = retry_delay
            if self.board is not None:
                lease.slot = self.board.post(
                    job.queue, job.id, job.attempt, started_ms=lease.started_ms,
                    hard_at=math.inf if lease.renew_until is None else lease.renew_until,
                    timeout=timeout or 0.0, retry_delay_ms=int(retry_delay * 1000))
            if lease.abort_by is not None:  # asked while it waited: stopped at once
                self._aim_abort(lease, now)
            return lease

    def request_abort(self, keys: QueueKeys,
                      asked: Iterable[tuple[str, int, str]]) -> list[str]:
        """Note the ``(job id, attempt, who asked)`` aborts the engine reports; the ids
        newly noted. A running job's limit becomes :data:`ABORT_NOTICE` seconds from now (the
        watchdog then raises JobAborted in it, or cancels it on its loop) and its hard
        limit a grace period later, on the board too, so that its host ends it if
        nothing else can; a buffered one is stopped so as it starts."""
        noted: list[str] = []
        now = time.monotonic()
        with self.lock:
            for job_id, attempt, who in asked:
                lease = self._leases.get((keys, job_id, attempt))
                if lease is None or lease.state == FINISHED or lease.abort_by is not None:
                    continue
                lease.abort_by = who
                noted.append(job_id)
                if lease.state == RUNNING:
                    self._aim_abort(lease, now)
        return noted

    def _aim_abort(self, lease: Lease, now: float) -> None:
        """Make ``lease``'s limit :data:`ABORT_NOTICE` from now and its hard limit a grace
        later (under the lock)."""
        lease.limit_at = min(now + ABORT_NOTICE, lease.limit_at or math.inf)
        lease.renew_until = min(lease.limit_at + lease.grace, lease.renew_until or math.inf)
        if lease.slot is not None and self.board is not None:
            self.board.abort(lease.slot, lease.renew_until, lease.abort_by or "")

    def shield(self, job: ClaimedJob) -> bool:
        """From now on no JobTimeout is raised in ``job``'s thread (its task is over).
        Returns whether one was raised before (and so may still be pending there)."""
        with self.lock:
            lease = self._leases.get(key(job))
            if lease is None:
                return True  # not known to be clear: the caller clears it anyway
            lease.shielded = True
            return lease.interrupted

    def interrupt(self, lease: Lease, raise_in: Callable[[threading.Thread], None]) -> bool:
        """Call ``raise_in(thread)`` for a running, unshielded lease of a thread of its
        own, once; an aborted async job's task is cancelled instead (the loop thread is
        shared: a time limit there is the coroutine's own ``asyncio.timeout``)."""
        with self.lock:
            thread = lease.thread
            if (lease.state != RUNNING or lease.shielded or lease.interrupted
                    or thread is None or self._leases.get(key(lease.job)) is not lease):
                return False
            if lease.on_loop:
                if lease.abort_by is None or lease.cancel is None:
                    return False
                lease.interrupted = True
                lease.cancel()
                return True
            lease.interrupted = True
            raise_in(thread)
            return True

    def finish(self, job: ClaimedJob, thread: threading.Thread) -> bool:
        """Mark ``job`` finished by ``thread``. False if it no longer runs there (the
        watchdog failed it after its hard limit, or its lease was lost): the caller
        then drops its outcome."""
        now = time.monotonic()
        with self.lock:
            lease = self._leases.get(key(job))
            if lease is None or lease.state != RUNNING or lease.thread is not thread:
                return False
            ran = now - lease.began
            average = self.avg_run_time[lease.lane]
            self.avg_run_time[lease.lane] = (ran if average is None
                                             else average + (ran - average) * 0.05)
            lease.state, lease.thread = FINISHED, None
            self._done_running(lease)
            self._reporting += 1
            self.finished_count += 1
            self._wake()
            return True

    def reported(self) -> None:
        """The outcome of a job :meth:`finish` gave to its thread is with the acker now
        (or will never be: the thread failed to give it)."""
        with self.lock:
            self._reporting -= 1
            self._wake()

    def abandon(self, job: ClaimedJob, *, buffered: bool = False) -> Lease | None:
        """Take a running ``job`` from its (stuck) thread and mark it finished, so the
        caller's outcome is the one acked (the watchdog's, at a hard limit); with
        ``buffered``, a job not started yet too. None if it was neither."""
        with self.lock:
            lease = self._leases.get(key(job))
            if lease is None or lease.state not in ((RUNNING, BUFFERED) if buffered
                                                    else (RUNNING,)):
                return None
            lease.state, lease.thread = FINISHED, None
            self._done_running(lease)
            self.finished_count += 1
            self.changed.notify_all()
            return lease

    def settle(self, jobs: Iterable[ClaimedJob]) -> None:
        """Forget ``jobs``: their acks landed, or they were handed back."""
        with self.lock:
            self.settles += 1
            for job in jobs:
                k = key(job)
                if k not in self._leases:
                    continue
                lease = self._drop(k)
                if lease.state != FINISHED:
                    self._done_running(lease)
            self.changed.notify_all()

    def lost(self, keys: QueueKeys, leases: Iterable[tuple[str, int]]) -> list[str]:
        """Note the ``(job id, attempt)`` leases the engine says are lost, except finished
        ones (whose ack may have landed after the heartbeat's snapshot: the acker settles
        those); the ids noted.
        A lost buffered job is forgotten and will not start; a running one runs to its
        end and its outcome goes to the engine, which ignores it as stale."""
        gone: list[str] = []
        with self.lock:
            for job_id, attempt in leases:
                lease = self._leases.get((keys, job_id, attempt))
                if lease is None or lease.state == FINISHED or lease.lost:
                    continue
                gone.append(job_id)
                if lease.state == RUNNING:
                    lease.lost = True
                    continue
                self._done_running(self._drop((keys, job_id, attempt)))
            self.changed.notify_all()
        return gone

    def withdraw_unstarted(self, jobs: Iterable[ClaimedJob] | None = None) -> list[ClaimedJob]:
        """Forget every buffered lease (of ``jobs`` only, if given) and return its job,
        to hand back: no thread starts it after this (:meth:`start` refuses it)."""
        with self.lock:
            keys = ([k for k, lease in self._leases.items() if lease.state == BUFFERED]
                    if jobs is None else
                    [k for k in map(key, jobs)
                     if k in self._leases and self._leases[k].state == BUFFERED])
            withdrawn = []
            for k in keys:
                lease = self._drop(k)
                self._done_running(lease)
                withdrawn.append(lease.job)
            self.changed.notify_all()
        return withdrawn

    def renewable(self) -> list[ClaimedJob]:
        """The jobs whose leases the heartbeat renews: buffered ones, ones a live
        thread runs within their time limit plus grace, and finished ones whose ack
        is pending (the acker is alive). Of two attempts of one job held at once, the
        later alone: the earlier one's ack has landed (the job was claimed again), and
        the engine answers for a job by its id."""
        now = time.monotonic()
        newest: dict[tuple[QueueKeys, str], ClaimedJob] = {}
        with self.lock:
            for lease in self._leases.values():
                job = lease.job
                seen = newest.get((job.keys, job.id))
                if _renewable(lease, now) and (seen is None or job.attempt > seen.attempt):
                    newest[job.keys, job.id] = job
        return list(newest.values())

    def running(self) -> list[Lease]:
        """The running leases (a snapshot; the Lease objects are live)."""
        with self.lock:
            return [lease for lease in self._leases.values() if lease.state == RUNNING]

    def wait_running(self, timeout: float | None, *, until: Callable[[], bool]) -> bool:
        """Wait (at most ``timeout`` seconds; None: no limit) until no live thread runs a
        job or holds an outcome not yet given to the acker, or ``until()`` (checked
        whenever the ledger changes) is true. Returns whether none does. A job whose
        thread died never ends: not waited for."""
        def quiet() -> bool:
            return not self._reporting and not any(
                lease.state == RUNNING and lease.thread is not None
                and lease.thread.is_alive() for lease in self._leases.values())

        with self.changed:
            self.changed.wait_for(lambda: quiet() or until(), timeout)
            return quiet()

    def held(self) -> list[ClaimedJob]:
        with self.lock:
            return [lease.job for lease in self._leases.values()]

