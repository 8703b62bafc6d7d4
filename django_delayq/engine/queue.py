"""``Queue``: live counts and controls of one named queue (over all of its shards)."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import keyed
from .job import Job, default_broker
from .jobhash import reply_time
from .status import FINISHED, PURGEABLE, STATUSES, Status

if TYPE_CHECKING:
    from .broker import Broker

logger = logging.getLogger("django_delayq.engine")

#: How many reasons of skipped events (by the mirror, the lake export) are kept per shard.
SKIPS_KEPT = 10


#: Minutes of throughput a queue summary covers.
SUMMARY_MINUTES = 60


@dataclass(slots=True)
class QueueSummary:
    """What the dashboard and the API show of a queue, read by :meth:`Queue.summary`."""

    name: str
    counts: dict[str, int]
    paused: bool
    next_due: dt.datetime | None
    shards: int
    #: (minute, completed, failed) for the last :data:`SUMMARY_MINUTES`, oldest first.
    throughput: list[tuple[dt.datetime, int, int]] = field(default_factory=list)

    @property
    def completed_recently(self) -> int:
        return sum(completed for _, completed, _ in self.throughput)

    @property
    def failed_recently(self) -> int:
        return sum(failed for _, _, failed in self.throughput)


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
                logger.warning("skipping a bad name in the queues set key=%s error=%s",
                               b.global_keys.queues, exc)
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
        broker = self.broker
        shards = broker.shards(self.name)
        with broker.read_errors():
            pipe = broker.client.pipeline(transaction=False)
            for keys in shards:
                for status in STATUSES:
                    pipe.zcard(keys.status_set(status))
                pipe.zscore(keys.key_waiting, keyed.TOTAL)  # ready, parked for a slot
            replies = pipe.execute()
        counts = dict.fromkeys(STATUSES, 0)
        per_shard = len(STATUSES) + 1
        for i, n in enumerate(replies):
            status = STATUSES[i % per_shard] if i % per_shard < len(STATUSES) else Status.READY
            counts[status] += int(n or 0)
        return counts

    def key_load(self, top: int = 10) -> keyed.KeyLoad:
        """The busiest concurrency keys: jobs holding a slot and jobs waiting for one."""
        return keyed.key_load(self.broker, self.name, top)

    def summary(self, *, throughput: bool = True) -> QueueSummary:
        """Counts, pause state, next due time, shards and (with ``throughput``) the jobs
        finished per minute of the last :data:`SUMMARY_MINUTES`."""
        return QueueSummary(
            name=self.name, counts=self.counts(), paused=self.is_paused,
            next_due=self.next_due(), shards=self.broker.shard_count(self.name),
            throughput=self.throughput(SUMMARY_MINUTES) if throughput else [])

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
        broker = self.broker
        with broker.read_errors():
            pipe = broker.client.pipeline(transaction=False)
            for keys in broker.shards(self.name):
                pipe.zrange(keys.scheduled, 0, 0, withscores=True)
            heads = [r[0][1] for r in pipe.execute() if r]
        return reply_time(int(min(heads))) if heads else None

    def purge(self, statuses: tuple[str, ...] = PURGEABLE) -> int:
        """Delete every job of ``statuses`` (never running ones). Returns how many."""
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
        return removed

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
        broker = self.broker
        with broker.read_errors():
            pipe = broker.client.pipeline(transaction=False)
            for keys in broker.shards(self.name):
                pipe.get(keys.skipped)
                pipe.lrange(keys.skipped_log, 0, SKIPS_KEPT - 1)
            replies = pipe.execute()
        counts, logs = replies[0::2], replies[1::2]
        count = sum(int(n) for n in counts if n and n.isdigit())
        reasons = sorted((r for log in logs for r in log), reverse=True)
        return count, reasons[:SKIPS_KEPT]

    def throughput(self, minutes: int = 60) -> list[tuple[dt.datetime, int, int]]:
        """(minute, completed, failed) for each of the last ``minutes`` minutes."""
        broker = self.broker
        with broker.read_errors():
            now_minute = broker.server_time_ms() // 60_000
            pipe = broker.client.pipeline(transaction=False)
            for keys in broker.shards(self.name):
                pipe.hgetall(keys.stats)
            merged: dict[str, int] = {}
            for stats in pipe.execute():
                for k, v in stats.items():
                    merged[k] = merged.get(k, 0) + int(v)
        return [
            (dt.datetime.fromtimestamp(m * 60, tz=dt.UTC), merged.get(f"c:{m}", 0),
             merged.get(f"f:{m}", 0))
            for m in range(now_minute - minutes + 1, now_minute + 1)
        ]


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
