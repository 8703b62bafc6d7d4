"""``Queue``: live counts and controls of one named queue (over all of its shards)."""

from __future__ import annotations

import datetime as dt
import logging
from typing import TYPE_CHECKING

from . import flows, keyed
from .errors import warn_once
from .job import Job, default_broker
from .overview import QueueSummary, summaries
from .status import FINISHED, PURGEABLE, Status

if TYPE_CHECKING:
    from .broker import Broker

logger = logging.getLogger("django_delayq.engine")

class Queue:
    """A named queue. Pausing stops every worker's claims; enqueuing still works."""

    def __init__(self, name: str = "default", *, broker: Broker | None = None) -> None:
        self.name = name
        self._given_broker = broker
        self.broker.shards(name)  # validates the name

    def __repr__(self) -> str:
        return f"<Queue {self.name!r}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Queue) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def broker(self) -> Broker:
        return self._given_broker or default_broker()

    @classmethod
    def all(cls, *, broker: Broker | None = None) -> list[Queue]:
        """Every queue seen by an enqueuer or a worker, by name.

        A name in the queues set that no queue can have (written there by hand) is
        skipped with a warning, so one bad entry hides no queue from its readers.
        """
        b = broker or default_broker()
        with b.read_errors():
            names = b.client.smembers(b.global_keys.queues)
        queues = []
        for name in sorted(names):
            try:
                queues.append(cls(name, broker=b))
            except ValueError as exc:
                warn_once(logger, f"queue:{name}", "skipping a bad name in the queues set",
                          key=b.global_keys.queues, error=exc)

        return queues

    @classmethod
    def seen(cls, name: str, *, broker: Broker | None = None) -> bool:
        """Whether an enqueuer or a worker has seen the queue ``name`` (one command)."""
        b = broker or default_broker()
        with b.read_errors():
            return bool(b.client.sismember(b.global_keys.queues, name))

    def counts(self) -> dict[str, int]:
        """Jobs per status (completed/failed/cancelled: those still kept; ready includes
        the jobs waiting for a slot of their concurrency key)."""
        return self.summary(detail=False).counts

    def key_load(self, top: int = 10) -> keyed.KeyLoad:
        """The busiest concurrency keys: jobs holding a slot and jobs waiting for one."""
        return keyed.key_load(self.broker, self.name, top)

    def summary(self, *, detail: bool = True) -> QueueSummary:
        """Counts, pause state, next due time, shards and stats; with ``detail``, the jobs
        finished per minute of the last hour and the skipped events (one round trip:
        :func:`~django_delayq.engine.overview.summaries`)."""
        return summaries(self.broker, [self.name], detail=detail)[0]

    def pause(self) -> None:
        """Stop every worker from claiming from this queue, at its next claim."""
        broker = self.broker
        with broker.connection_errors():
            pipe = broker.client.pipeline(transaction=False)
            for keys in broker.shards(self.name):
                pipe.set(keys.paused, "1")
            pipe.execute()

    def resume(self) -> None:
        """Let workers claim again, and wake idle ones at once."""
        broker = self.broker
        with broker.connection_errors():
            pipe = broker.client.pipeline(transaction=False)
            for keys in broker.shards(self.name):
                pipe.delete(keys.paused)
                pipe.zadd(keys.marker, {"0": 0})
            pipe.execute()

    @property
    def is_paused(self) -> bool:
        broker = self.broker
        with broker.read_errors():
            return bool(broker.client.exists(broker.shards(self.name)[0].paused))

    def next_due(self) -> dt.datetime | None:
        """The run_at of the earliest scheduled job, or None."""
        return self.summary(detail=False).next_due

    def purge(self, statuses: tuple[str, ...] = PURGEABLE, *, forget: bool = False) -> int:
        """Delete every job of ``statuses`` (never running ones). Returns how many.

        Their dependants in other queues are told at once (a dependant in the same shard
        is told by the purge itself), not at a heartbeat of a worker of this queue,
        which may have none. With ``forget``, then :meth:`forget` the queue."""
        broker = self.broker
        removed = 0
        for status in statuses:
            if status not in PURGEABLE:
                raise ValueError(f"cannot purge {status!r} jobs; "
                                 f"choose from {tuple(map(str, PURGEABLE))}")
            for keys in broker.shards(self.name):
                while True:
                    with broker.connection_errors():
                        n = broker.commands.purge(keys, status, 500)
                    removed += n
                    if n == 0:
                        break
                if status == Status.READY:
                    removed += keyed.purge_parked(broker, keys)
        if removed:
            for keys in broker.shards(self.name):
                flows.deliver(broker, keys)
        if forget:
            self.forget()
        return removed

    def forget(self) -> bool:
        """Remove the queue from the set of known queues, so the dashboard, the API and
        the metrics stop listing it, unless it still holds jobs (running ones, or any
        :meth:`purge` left). Returns whether it was forgotten.

        A queue is known again as soon as a job is enqueued into it or a worker serving
        it beats; a declared queue (``QUEUES``, a registered task's) is listed anyway.
        Its events stream is left to be read and trimmed as usual."""
        if any(self.counts().values()):
            return False
        with self.broker.connection_errors():
            self.broker.forget_queue(self.name)
        return True

    def jobs(self, status: str = Status.READY, offset: int = 0, limit: int = 50) -> list[Job]:
        """Jobs of one status in queue order (finished ones newest first)."""
        broker = self.broker
        newest_first = status in FINISHED
        found: list[tuple[float, str, dict[str, str]]] = []
        with broker.read_errors():
            for keys in broker.shards(self.name):
                set_key = keys.status_set(status)
                if newest_first:
                    ids = broker.client.zrevrange(set_key, 0, offset + limit - 1, withscores=True)
                else:
                    ids = broker.client.zrange(set_key, 0, offset + limit - 1, withscores=True)
                pipe = broker.client.pipeline(transaction=False)
                for job_id, _ in ids:
                    pipe.hgetall(keys.job(job_id))
                replies = pipe.execute(raise_on_error=False)
                for (job_id, score), data in zip(ids, replies, strict=True):
                    found.append((score, job_id, data))
        found.sort(key=lambda item: item[0], reverse=newest_first)
        return [_listed(self.name, job_id, data, broker)
                for _, job_id, data in found[offset:offset + limit]]

    def skipped_events(self) -> tuple[int, list[str]]:
        """Events the model mirror or the lake export skipped as unusable: how many, and
        the newest reasons (each with its time, who skipped it and the stream id, newest
        first), over every shard."""
        summary = self.summary()
        return summary.skipped, summary.skipped_reasons

    def throughput(self, minutes: int = 60) -> list[tuple[dt.datetime, int, int]]:
        """(minute, completed, failed) for each of the last ``minutes`` minutes."""
        return summaries(self.broker, [self.name], detail=True, minutes=minutes)[0].throughput


def _listed(queue: str, job_id: str, data: dict[str, str] | Exception, broker: Broker) -> Job:
    """A job of a status set: read from its hash, ``missing`` without one, and shown as
    damaged when its key is not a hash."""
    if isinstance(data, Exception):
        return Job(id=job_id, queue=queue, broker=broker,
                   damaged={"record": f"unreadable: {str(data)[:80]}"})
    if not data:
        return Job(id=job_id, queue=queue, status="missing", broker=broker)
    return Job.from_hash(queue, job_id, data, broker)


def flush_database(broker: Broker) -> None:
    """Empty the database of ``broker``'s Redis (every key, not only this app's): for a
    throwaway Redis of tests only."""
    with broker.read_errors():
        broker.client.flushdb()
