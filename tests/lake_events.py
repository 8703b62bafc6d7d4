"""Many jobs' events, fast: real enqueues, then their attempts' events in bulk entries.

The jobs are enqueued through the engine (``enqueue_many``: real hashes and ``enqueued``
entries); their ``claimed``, ``started`` and ``completed`` entries are then appended in
the engine's own format (one entry per 1,000 jobs, as its scripts write them) with chosen
times, so that every job's lateness and duration is known in advance. Shared by the lake
tests and bench/lake.py.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from django_delayq.engine import Broker, EnqueueRequest
from django_delayq.engine.keys import QueueKeys
from django_delayq.engine.streams import StreamBatch
from django_delayq.lake import Exporter

CHUNK = 1_000
EVENTS_PER_JOB = 4  # enqueued, claimed, started, completed


@dataclass
class Generated:
    jobs: int
    lateness: list[float]  # seconds, one per job
    duration: list[float]

    @property
    def events(self) -> int:
        return self.jobs * EVENTS_PER_JOB


def generate(broker: Broker, task: str, keys: QueueKeys, jobs: int, *,
             t0: dt.datetime) -> Generated:
    """Enqueue ``jobs`` jobs of ``task`` due from ``t0`` (one per ms), then append the
    events of one completed attempt each: started (1,000 jobs at a time) 1 to 3 s
    after the last run_at of its chunk, finished ``chunk % 7`` s later."""
    t0_ms = int(t0.timestamp() * 1000)
    broker.enqueue_many(keys.queue, (
        EnqueueRequest(task=task, args=[i], job_id=f"g-{i}",
                       run_at=t0 + dt.timedelta(milliseconds=i)) for i in range(jobs)))
    client = broker.client
    lateness: list[float] = []
    duration: list[float] = []
    pipe = client.pipeline(transaction=False)
    for c, first in enumerate(range(0, jobs, CHUNK)):
        ids = [f"g-{i}" for i in range(first, min(first + CHUNK, jobs))]
        names, ones = " ".join(ids), " ".join("1" for _ in ids)
        start = t0_ms + first + len(ids) + 1_000 + 1_000 * (c % 3)
        end = start + 1_000 * (c % 7)
        lateness += [(start - (t0_ms + first + k)) / 1000 for k in range(len(ids))]
        duration += [(end - start) / 1000] * len(ids)
        for event, ts, extra in (("claimed", start - 5, {"worker": f"w-{c % 4}"}),
                                 ("started", start, {"worker": f"w-{c % 4}"}),
                                 ("completed", end, {})):
            pipe.xadd(keys.events, {"event": event, "jobs": names, "attempts": ones,
                                    "ts": ts, **extra})
        if c % 50 == 49:
            pipe.execute()
    pipe.execute()
    return Generated(jobs, lateness, duration)


class Crash(BaseException):
    """Raised where a process would die: after a file, before its acknowledgement (a
    BaseException: no loop of the consumer catches it, as none survives a SIGKILL)."""


class CrashBeforeAck(Exporter):
    """Dies before acknowledging its ``after``-th batch (its file is written)."""

    def __init__(self, *args: Any, after: int = 1, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.after = after

    def _acknowledge(self, keys: QueueKeys, batch: StreamBatch) -> None:
        self.after -= 1
        if self.after <= 0:
            raise Crash
        super()._acknowledge(keys, batch)
