"""``Job``: one job's state as Redis holds it, and what can be done to it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from . import flows, validation
from .errors import InvalidJobState, JobNotFound
from .fields import stored
from .jobhash import from_ms, read_job_hash, reply_time
from .status import CANCELLABLE, FINISHED, LEASED, PENDING, RETRYABLE, Status

if TYPE_CHECKING:
    from .broker import Broker

_default_broker: Callable[[], Broker] | None = None


def set_default_broker(factory: Callable[[], Broker] | None) -> None:
    """Set what ``Job.fetch`` and ``Queue`` use when no broker is passed (Django sets it)."""
    global _default_broker
    _default_broker = factory


def default_broker() -> Broker:
    if _default_broker is None:
        raise RuntimeError(
            "no default broker: pass broker=..., or add 'django_delayq' to INSTALLED_APPS"
        )
    return _default_broker()


@dataclass(eq=False)
class Job:
    """A job as last read from Redis. ``refresh()`` reads it again."""

    id: str
    queue: str
    task_name: str = ""
    status: str = ""
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    run_at: dt.datetime | None = None
    attempts: int = 0
    max_attempts: int = 1
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    worker: str | None = None
    enqueued_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    #: Fraction done (0..1) the task last reported, None when it reported none.
    progress: float | None = None
    #: The message the task reported with its progress.
    progress_message: str = ""
    #: The job's own time limit per attempt, seconds (None: the worker's default).
    timeout: float | None = None
    #: The last attempts, oldest first: dicts with ``attempt``, ``worker``,
    #: ``started_at``, ``finished_at`` (aware datetimes), ``outcome`` and ``error``.
    attempt_log: list[dict[str, Any]] = field(default_factory=list)
    #: The ``(queue, id)`` jobs this one waits for or waited for (``depends_on``), in order.
    parent_refs: list[tuple[str, str]] = field(default_factory=list)
    #: Who asked for its abort (or cancel, through :meth:`abort`); '' when nobody did.
    aborted_by: str = ""
    #: False when ``enqueue`` found a job with this id already there (nothing added).
    created: bool = True
    #: What ``enqueue`` did: "created", "duplicate", or with a dedupe key "replaced"
    #: (this job, waiting, took the new arguments) or "ignored" (throttled); "outbox"
    #: for a job written to the outbox (decided when the row reaches Redis).
    outcome: str = "created"
    #: Its concurrency key, and whether it waits for one of the key's slots (ready, but
    #: the key is at its limit).
    concurrency_key: str | None = None
    waiting_for_slot: bool = False
    #: Fields of the stored hash that could not be read: field -> what was found there
    #: (the attribute then holds its default). Empty for a sound record.
    damaged: dict[str, str] = field(default_factory=dict)
    broker: Broker | None = field(default=None, repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Job):
            return NotImplemented
        return (self.queue, self.id) == (other.queue, other.id)

    def __hash__(self) -> int:
        return hash((self.queue, self.id))

    @property
    def _broker(self) -> Broker:
        if self.broker is None:
            self.broker = default_broker()
        return self.broker

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    @classmethod
    def fetch(cls, job_id: str, queue: str = "default", *, broker: Broker | None = None) -> Job:
        """Read a job from Redis; raises :class:`JobNotFound` when it does not exist."""
        job = cls(id=validation.validate_job_id(job_id), queue=queue, broker=broker)
        return job.refresh()

    def refresh(self) -> Job:
        """Read this job's state from Redis again (in place) and return it."""
        broker = self._broker
        key = broker.keys_for(self.queue, self.id).job(self.id)
        with broker.connection_errors():
            try:
                data = broker.client.hgetall(key)
            except ResponseError as exc:
                if "WRONGTYPE" not in str(exc):
                    raise
                # Not a hash (written by hand): shown as damaged, not raised.
                self._load({})
                self.damaged = {"record": f"a {broker.client.type(key)} key, not a hash"}
                return self
        if not data:
            raise JobNotFound(f"no job {self.id!r} in queue {self.queue!r}")
        self._load(data)
        return self

    def _load(self, stored: dict[str, str]) -> None:
        """Take the state of the job hash ``stored`` (HGETALL's answer, stored names)."""
        h = read_job_hash(stored)
        self.task_name, self.status, self.args, self.kwargs = h.task, h.status, h.args, h.kwargs
        self.priority, self.run_at, self.attempts = h.priority, h.run_at, h.attempts
        self.max_attempts, self.result, self.error = h.max_attempts, h.result, h.error
        self.traceback, self.worker, self.enqueued_at = h.traceback, h.worker, h.enqueued_at
        self.started_at, self.finished_at = h.started_at, h.finished_at
        self.progress, self.progress_message = h.progress, h.progress_message
        self.timeout, self.attempt_log = h.timeout, h.attempt_log
        self.damaged = h.damaged
        self.parent_refs = h.parents
        self.concurrency_key, self.waiting_for_slot = h.concurrency_key, h.waiting_for_slot

        self.aborted_by = h.aborted_by

    @classmethod
    def from_hash(cls, queue: str, job_id: str, data: dict[str, str],
                  broker: Broker | None) -> Job:
        """The job whose hash HGETALL returned as ``data`` (keyed by stored field names)."""
        job = cls(id=job_id, queue=queue, broker=broker)
        job._load(data)
        return job

    def cancel(self) -> bool:
        """Cancel the job if it has not started (a waiting one too). Returns whether it
        was cancelled; its dependants then follow their ``on_parent_failure`` policy.
        A running job is left running: :meth:`abort` stops it."""
        return self._cancel("")

    def abort(self, by: str = "") -> bool:
        """Stop the job: one that has not started is cancelled at once, as by
        :meth:`cancel`; a running one (``claimed`` or ``active``) is asked to stop, and
        ends ``cancelled`` when its attempt ends. Its worker hears of it at its next
        heartbeat: a task that checks ``current_job().abort_requested`` stops by itself,
        others get :class:`~django_delayq.engine.errors.JobAborted` raised in them (an
        async one is cancelled), and a job still running a grace period later has its
        worker process replaced, as at a hard time limit. ``by`` says who asked (shown
        with the job as ``aborted_by``). Returns whether the job was cancelled or asked
        to stop (False: it had already finished)."""
        return self._cancel(by or "unknown")

    def _cancel(self, who: str) -> bool:
        broker = self._broker
        keys = broker.keys_for(self.queue, self.id)
        with broker.read_errors():
            before, pushed = broker.commands.cancel(keys, self.id, who)
        if before == "":
            raise JobNotFound(f"no job {self.id!r} in queue {self.queue!r}")
        if pushed:  # dependants in other shards: resolve them now (a worker would, later)
            flows.deliver(broker, keys)
        cancelled = before in CANCELLABLE
        self.status = Status.CANCELLED if cancelled else before
        if cancelled or (who and before in LEASED):
            self.aborted_by = self.aborted_by or who
            return True
        return False

    @property
    def parents(self) -> list[Job]:
        """The jobs this one waits (or waited) for, in order, as last read from Redis (a
        parent whose record expired is left out)."""
        out = []
        for queue, job_id in self.parent_refs:
            try:
                out.append(Job.fetch(job_id, queue, broker=self._broker))
            except JobNotFound:
                continue
        return out

    @property
    def children(self) -> list[Job]:
        """The jobs that wait (or waited) for this one, read from Redis (kept while this
        job's record lives)."""
        out = []
        for queue, job_id in flows.children_of(self._broker, self.queue, self.id):
            try:
                out.append(Job.fetch(job_id, queue, broker=self._broker))
            except JobNotFound:
                continue
        return out

    def reschedule(
        self, *, run_at: dt.datetime | None = None, delay: Any = None, priority: int | None = None
    ) -> Job:
        """Move a job that has not started to ``run_at`` (or ``delay`` from now).

        Raises :class:`InvalidJobState` when the job is running or finished.
        """
        if run_at is not None and delay is not None:
            raise ValueError("give run_at or delay, not both")
        run_at_arg = "" if run_at is None else validation.run_at_ms(run_at)
        delay_arg = "" if delay is None else validation.delay_ms(delay)
        prio_arg = "" if priority is None else validation.check_priority(priority)
        broker = self._broker
        keys = broker.keys_for(self.queue, self.id)
        with broker.read_errors():
            before, after, when = broker.commands.reschedule(keys, self.id, run_at_arg,
                                                             delay_arg, prio_arg)
        if before == "":
            raise JobNotFound(f"no job {self.id!r} in queue {self.queue!r}")
        if before not in PENDING:
            raise InvalidJobState(self.id, before, "rescheduled", PENDING)
        self.status, self.run_at = after, reply_time(when)
        if priority is not None:
            self.priority = priority
        return self

    def retry(self, *, run_at: dt.datetime | None = None, delay: Any = None) -> Job:
        """Run a failed or cancelled job again, with a fresh budget of attempts.

        The attempt count goes on and ``max_attempts`` grows by the attempts used, so
        attempt numbers stay unique: a worker still holding an earlier run can never
        acknowledge this one, and the attempt log keeps one entry per run.
        """
        if run_at is not None and delay is not None:
            raise ValueError("give run_at or delay, not both")
        run_at_arg = "" if run_at is None else validation.run_at_ms(run_at)
        delay_arg = "" if delay is None else validation.delay_ms(delay)
        broker = self._broker
        keys = broker.keys_for(self.queue, self.id)
        with broker.read_errors():
            before, after, attempts, most = broker.commands.retry(
                keys, self.id, run_at_arg, delay_arg)
        if before == "":
            raise JobNotFound(f"no job {self.id!r} in queue {self.queue!r}")
        if before not in RETRYABLE:
            raise InvalidJobState(self.id, before, "retried", RETRYABLE)
        self.attempts, self.max_attempts = attempts, most
        self.status, self.error, self.traceback = after, None, None
        return self

    def position(self) -> int | None:
        """How many jobs of its queue shard run before this one (None once it started).

        A scheduled job counts the ready jobs and the scheduled jobs due before it.
        """
        broker = self._broker
        keys = broker.keys_for(self.queue, self.id)
        with broker.connection_errors():
            pipe = broker.client.pipeline(transaction=False)
            pipe.zrank(keys.ready, self.id)
            pipe.zscore(keys.scheduled, self.id)
            pipe.zcard(keys.ready)
            rank, run_at, ready_count = pipe.execute()
            if rank is not None:
                return int(rank)
            if run_at is None:
                return None
            ahead = broker.client.zcount(keys.scheduled, "-inf", f"({run_at}")
        return int(ready_count) + int(ahead)

    def estimated_start(self) -> dt.datetime | None:
        """Estimated start on a rate-limited or interval queue (see :func:`estimated_start`)."""
        return estimated_start(self)


def estimated_start(job: Job) -> dt.datetime | None:
    """When a job of a rate-limited or interval queue should start, if workers keep up.

    The jobs ahead of it (its position, times the shard count for a sharded queue, as
    shards are drained evenly) start at the queue's limit: the free room of the current
    window first, then ``limit`` per window. None for a job that started or finished,
    or on a queue with no limit (its start then depends on worker throughput).
    """
    broker = job._broker
    limit = broker.rate_limit(job.queue)
    if limit is None:
        return None
    ahead = job.position()
    if ahead is None:
        return None
    ahead *= broker.shard_count(job.queue)
    key = broker.limit_key(job.queue)
    with broker.connection_errors():
        now = broker.server_time_ms()
        starts = broker.client.zrange(key, 0, -1, withscores=True)
    # Replay the window: each start waits until the start `limit` places before it
    # has left the window (the same rule the claim script applies).
    times = sorted(int(s) for _, s in starts if s > now - limit.period_ms)
    start = now
    for _ in range(min(ahead, 1_000_000) + 1):
        earlier = times[-limit.limit] if len(times) >= limit.limit else None
        start = now if earlier is None else max(now, earlier + limit.period_ms)
        times.append(start)
    run_at = validation.run_at_ms(job.run_at) if job.run_at is not None else 0
    return from_ms(max(start, run_at, now))


def aborts_asked(broker: Broker, jobs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Of the ``(queue, id)`` jobs, those whose abort was asked for, with who asked (one
    round trip): what a worker's host reads of the jobs its processes run, as no thread
    of a frozen process can."""
    if not jobs:
        return {}
    with broker.connection_errors():
        pipe = broker.client.pipeline(transaction=False)
        for queue, job_id in jobs:
            pipe.hget(broker.keys_for(queue, job_id).job(job_id), stored("aborted_by"))
        replies = pipe.execute()
    return {job: str(who) for job, who in zip(jobs, replies, strict=True) if who}
