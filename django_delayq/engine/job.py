"""``Job``: one job's state as Redis holds it, and what can be done to it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import validation as check
from .codec import decode
from .errors import InvalidJobState, JobNotFound
from .fields import logical
from .scripts import call

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


def from_ms(value: Any) -> dt.datetime | None:
    """Epoch milliseconds (as Redis returns them) as an aware UTC datetime."""
    if value in (None, "", 0, "0"):
        return None
    return dt.datetime.fromtimestamp(int(value) / 1000, tz=dt.UTC)


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


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
    #: False when ``enqueue`` found a job with this id already there (nothing added).
    created: bool = True
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
        return self.status in ("completed", "failed", "cancelled")

    @classmethod
    def fetch(cls, job_id: str, queue: str = "default", *, broker: Broker | None = None) -> Job:
        """Read a job from Redis; raises :class:`JobNotFound` when it does not exist."""
        job = cls(id=check.validate_job_id(job_id), queue=queue, broker=broker)
        return job.refresh()

    def refresh(self) -> Job:
        """Read this job's state from Redis again (in place) and return it."""
        broker = self._broker
        with broker.connection_errors():
            data = broker.client.hgetall(broker.keys_for(self.queue, self.id).job(self.id))
        if not data:
            raise JobNotFound(f"no job {self.id!r} in queue {self.queue!r}")
        self._load(data)
        return self

    def _load(self, stored: dict[str, str]) -> None:
        """Take the state of the job hash ``stored`` (HGETALL's answer, stored names)."""
        data = logical(stored)
        self.task_name = data.get("task", "")
        self.status = data.get("status", "")
        self.args = _decode_or_raw(data.get("args"), [])
        self.kwargs = _decode_or_raw(data.get("kwargs"), {})
        self.priority = _int(data.get("priority"))
        self.run_at = from_ms(data.get("run_at"))
        self.attempts = _int(data.get("attempts"))
        self.max_attempts = _int(data.get("max_attempts"), 1)
        self.result = _decode_or_raw(data.get("result"), None)
        self.error = data.get("error")
        self.traceback = data.get("traceback")
        self.worker = data.get("worker")
        self.enqueued_at = from_ms(data.get("enqueued_at"))
        self.started_at = from_ms(data.get("started_at"))
        self.finished_at = from_ms(data.get("finished_at"))

    @classmethod
    def from_hash(cls, queue: str, job_id: str, data: dict[str, str], broker: Broker) -> Job:
        """The job whose hash HGETALL returned as ``data`` (keyed by stored field names)."""
        job = cls(id=job_id, queue=queue, broker=broker)
        job._load(data)
        return job

    def cancel(self) -> bool:
        """Cancel the job if it has not started. Returns whether it was cancelled."""
        broker = self._broker
        keys = broker.keys_for(self.queue, self.id)
        cfg = broker.config
        with broker.connection_errors():
            before = call(
                broker.client, "cancel",
                [keys.job(self.id), keys.scheduled, keys.ready, keys.cancelled, keys.events],
                [self.id, cfg.result_ttl_ms, cfg.keep_completed, cfg.events_maxlen],
            )
        if before == "":
            raise JobNotFound(f"no job {self.id!r} in queue {self.queue!r}")
        cancelled = before in ("scheduled", "ready")
        self.status = "cancelled" if cancelled else before
        return cancelled

    def reschedule(
        self, *, run_at: dt.datetime | None = None, delay: Any = None, priority: int | None = None
    ) -> Job:
        """Move a job that has not started to ``run_at`` (or ``delay`` from now).

        Raises :class:`InvalidJobState` when the job is running or finished.
        """
        if run_at is not None and delay is not None:
            raise ValueError("give run_at or delay, not both")
        run_at_arg = "" if run_at is None else check.run_at_ms(run_at)
        delay_arg = "" if delay is None else check.delay_ms(delay)
        prio_arg = "" if priority is None else check.check_priority(priority)
        broker = self._broker
        keys = broker.keys_for(self.queue, self.id)
        with broker.connection_errors():
            before, after, when = call(
                broker.client, "reschedule",
                [keys.job(self.id), keys.scheduled, keys.ready, keys.marker, keys.events,
                 keys.seq],
                [self.id, run_at_arg, delay_arg, prio_arg, broker.config.events_maxlen],
            )
        if before == "":
            raise JobNotFound(f"no job {self.id!r} in queue {self.queue!r}")
        if before not in ("scheduled", "ready"):
            raise InvalidJobState(f"job {self.id!r} is {before}: only a scheduled or ready "
                                  "job can be rescheduled")
        self.status, self.run_at = after, from_ms(when)
        if priority is not None:
            self.priority = priority
        return self

    def retry(self, *, run_at: dt.datetime | None = None, delay: Any = None) -> Job:
        """Run a failed or cancelled job again, with its attempts starting over."""
        if run_at is not None and delay is not None:
            raise ValueError("give run_at or delay, not both")
        run_at_arg = "" if run_at is None else check.run_at_ms(run_at)
        delay_arg = "" if delay is None else check.delay_ms(delay)
        broker = self._broker
        keys = broker.keys_for(self.queue, self.id)
        with broker.connection_errors():
            before, after = call(
                broker.client, "retry",
                [keys.job(self.id), keys.failed, keys.cancelled, keys.scheduled, keys.ready,
                 keys.marker, keys.events, keys.seq],
                [self.id, run_at_arg, delay_arg, broker.config.events_maxlen],
            )
        if before == "":
            raise JobNotFound(f"no job {self.id!r} in queue {self.queue!r}")
        if before not in ("failed", "cancelled"):
            raise InvalidJobState(f"job {self.id!r} is {before}: only a failed or cancelled "
                                  "job can be retried")
        self.status, self.attempts, self.error, self.traceback = after, 0, None, None
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


def _decode_or_raw(text: str | None, default: Any) -> Any:
    """Decode stored JSON; a corrupted value is returned as its raw text, not raised."""
    if text is None:
        return default
    try:
        return decode(text)
    except (ValueError, RecursionError):
        return text


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
    run_at = check.run_at_ms(job.run_at) if job.run_at is not None else 0
    return from_ms(max(start, run_at, now))
