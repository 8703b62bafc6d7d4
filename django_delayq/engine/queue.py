"""``Queue``: live counts and controls of one named queue (over all of its shards)."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from .job import Job, default_broker, from_ms
from .keys import STATUSES
from .scripts import call

if TYPE_CHECKING:
    from .broker import Broker

PURGEABLE = ("scheduled", "ready", "completed", "failed", "cancelled")


class Queue:
    """A named queue. Pausing holds every worker's claims; enqueuing still works."""

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
        """Every queue seen by an enqueuer or a worker, by name."""
        b = broker or default_broker()
        with b.connection_errors():
            names = b.client.smembers(b.global_keys.queues)
        return [cls(name, broker=b) for name in sorted(names)]

    def counts(self) -> dict[str, int]:
        """Jobs per status (completed/failed/cancelled: those still kept)."""
        broker = self.broker
        shards = broker.shards(self.name)
        with broker.connection_errors():
            pipe = broker.client.pipeline(transaction=False)
            for keys in shards:
                for status in STATUSES:
                    pipe.zcard(keys.status_set(status))
            replies = pipe.execute()
        counts = dict.fromkeys(STATUSES, 0)
        for i, n in enumerate(replies):
            counts[STATUSES[i % len(STATUSES)]] += int(n)
        return counts

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
        with broker.connection_errors():
            return bool(broker.client.exists(broker.shards(self.name)[0].paused))

    def next_due(self) -> dt.datetime | None:
        """The run_at of the earliest scheduled job, or None."""
        broker = self.broker
        with broker.connection_errors():
            pipe = broker.client.pipeline(transaction=False)
            for keys in broker.shards(self.name):
                pipe.zrange(keys.scheduled, 0, 0, withscores=True)
            heads = [r[0][1] for r in pipe.execute() if r]
        return from_ms(int(min(heads))) if heads else None

    def purge(self, statuses: tuple[str, ...] = PURGEABLE) -> int:
        """Delete every job of ``statuses`` (never running ones). Returns how many."""
        broker = self.broker
        removed = 0
        for status in statuses:
            if status not in PURGEABLE:
                raise ValueError(f"cannot purge {status!r} jobs; choose from {PURGEABLE}")
            for keys in broker.shards(self.name):
                while True:
                    with broker.connection_errors():
                        n = int(call(broker.client, "purge",
                                     [keys.status_set(status), keys.events, keys.job_prefix],
                                     [500, broker.config.events_maxlen]))
                    removed += n
                    if n == 0:
                        break
        return removed

    def jobs(self, status: str = "ready", offset: int = 0, limit: int = 50) -> list[Job]:
        """Jobs of one status in queue order (finished ones newest first)."""
        broker = self.broker
        newest_first = status in ("completed", "failed", "cancelled")
        found: list[tuple[float, str, dict[str, str]]] = []
        with broker.connection_errors():
            for keys in broker.shards(self.name):
                set_key = keys.status_set(status)
                if newest_first:
                    ids = broker.client.zrevrange(set_key, 0, offset + limit - 1, withscores=True)
                else:
                    ids = broker.client.zrange(set_key, 0, offset + limit - 1, withscores=True)
                pipe = broker.client.pipeline(transaction=False)
                for job_id, _ in ids:
                    pipe.hgetall(keys.job(job_id))
                for (job_id, score), data in zip(ids, pipe.execute(), strict=True):
                    found.append((score, job_id, data))
        found.sort(key=lambda item: item[0], reverse=newest_first)
        return [
            Job.from_hash(self.name, job_id, data, broker) if data
            else Job(id=job_id, queue=self.name, status="missing", broker=broker)
            for _, job_id, data in found[offset:offset + limit]
        ]

    def throughput(self, minutes: int = 60) -> list[tuple[dt.datetime, int, int]]:
        """(minute, completed, failed) for each of the last ``minutes`` minutes."""
        broker = self.broker
        with broker.connection_errors():
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
