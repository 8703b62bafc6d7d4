"""Many queues read at once: what the dashboard, the API and the metrics show of each.

:func:`summaries` reads any number of queues in one pipelined round trip (and one clock
read, at most once a minute), so a page or a scrape costs the same few round trips
whether the project has 5 queues or 5,000; the commands it sends grow with the queues'
shards, never with their jobs. ``Queue.summary()`` is the same read for one queue.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .failover import follow_primary
from .jobhash import reply_time, to_int
from .keyed import TOTAL
from .scripts import execute_loading
from .stats import QueueStats
from .status import STATUSES, Status

if TYPE_CHECKING:
    from .core import BrokerCore

#: Minutes of throughput a queue summary covers.
SUMMARY_MINUTES = 60
#: How many reasons of skipped events (by the mirror, the lake export) are kept per shard.
SKIPS_KEPT = 10


@dataclass(slots=True)
class QueueSummary:
    """What the dashboard, the API and the metrics show of a queue (:func:`summaries`)."""

    name: str
    counts: dict[str, int]
    paused: bool
    next_due: dt.datetime | None
    shards: int
    #: Totals and histograms since the queue's stats began (every shard's summed); none
    #: of them ever goes back (``lua/counters.lua``).
    stats: QueueStats = field(default_factory=QueueStats)
    #: Since when no total went back: the newest start of a shard's marks (a Redis that
    #: lost everything starts them again; None when the queue has no shard read).
    counters_since: dt.datetime | None = None
    #: (minute, completed, failed) for the last :data:`SUMMARY_MINUTES`, oldest first
    #: (empty unless read with ``detail``).
    throughput: list[tuple[dt.datetime, int, int]] = field(default_factory=list)
    #: Events the model mirror or the lake export skipped as unusable, and the newest
    #: reasons (unless read with ``detail``: 0 and none).
    skipped: int = 0
    skipped_reasons: list[str] = field(default_factory=list)

    @property
    def completed_recently(self) -> int:
        return sum(completed for _, completed, _ in self.throughput)

    @property
    def failed_recently(self) -> int:
        return sum(failed for _, _, failed in self.throughput)


def summaries(broker: BrokerCore, names: list[str], *, detail: bool = False,
              minutes: int = SUMMARY_MINUTES, confirm_primary: bool = False,
              ) -> list[QueueSummary]:
    """The :class:`QueueSummary` of each of ``names``, in their order: counts, pause state,
    next due time and stats, and with ``detail`` the throughput of the last ``minutes``
    and the skipped events. One round trip whatever the number of queues (two when the
    Redis clock's offset must be read again).

    With ``confirm_primary`` (the metrics: a series Prometheus keeps), on a Sentinel URL
    the figures are returned only if every sentinel still names the primary that
    answered, with no failover under way (:func:`.failover.follow_primary`; one round
    trip per sentinel); else :class:`DelayQConnectionError`. A primary being failed
    over still answers until it is demoted, with totals, and marks of the figures shown
    (``lua/counters.lua``), that its successor never gets: shown, they would go back."""
    per_shard = len(STATUSES) + 4 + (2 if detail else 0)
    def fill(pipe: Any) -> None:
        for name in names:
            for keys in broker.shards(name):
                for status in STATUSES:
                    pipe.zcard(keys.status_set(status))
                pipe.exists(keys.paused)
                pipe.zrange(keys.scheduled, 0, 0, withscores=True)
                pipe.execute_command(*broker.commands.counters(keys, detail))
                pipe.zscore(keys.key_waiting, TOTAL)  # ready, parked for a key's slot
                if detail:
                    pipe.get(keys.skipped)
                    pipe.lrange(keys.skipped_log, 0, SKIPS_KEPT - 1)

    with broker.read_errors():
        now_minute = broker.recent_server_time_ms() // 60_000 if detail else 0
        replies = execute_loading(broker.client, fill, ["counters"]) if names else []
        if confirm_primary:
            follow_primary(broker.client)
    found, at = [], 0
    for name in names:
        shards = broker.shard_count(name)
        summary = _summary(name, shards, replies[at:at + shards * per_shard], per_shard,
                           now_minute if detail else None, minutes)
        at += shards * per_shard
        found.append(summary)
    return found


def _summary(name: str, shards: int, replies: list[Any], per_shard: int,
             now_minute: int | None, minutes: int) -> QueueSummary:
    counts = dict.fromkeys(STATUSES, 0)
    stats, paused = QueueStats(), False
    heads: list[float] = []
    merged: dict[str, int] = {}
    skipped, reasons = 0, []
    since = 0
    for i in range(shards):
        shard = replies[i * per_shard:(i + 1) * per_shard]
        for status, n in zip(STATUSES, shard, strict=False):
            counts[status] += int(n)
        exists, head, counted, parked = shard[len(STATUSES):len(STATUSES) + 4]
        began, stored = counted_stats(counted)
        since = max(since, began)
        counts[Status.READY] += int(parked or 0)
        paused = paused or (i == 0 and bool(exists))  # pausing writes every shard
        if head:
            heads.append(head[0][1])
        stats.add(stored)
        if now_minute is not None:
            for key, value in stored.items():
                if key[:2] in ("c:", "f:"):
                    merged[key] = merged.get(key, 0) + to_int(value)
            count, log = shard[len(STATUSES) + 4:]
            skipped += to_int(count)
            reasons.extend(log)
    throughput = [] if now_minute is None else [
        (dt.datetime.fromtimestamp(m * 60, tz=dt.UTC), merged.get(f"c:{m}", 0),
         merged.get(f"f:{m}", 0))
        for m in range(now_minute - minutes + 1, now_minute + 1)]
    return QueueSummary(
        name=name, counts=counts, paused=paused,
        next_due=reply_time(int(min(heads))) if heads else None, shards=shards,
        stats=stats, counters_since=reply_time(since) if since else None,
        throughput=throughput, skipped=skipped,
        skipped_reasons=sorted(reasons, reverse=True)[:SKIPS_KEPT])



def counted_stats(reply: list[Any]) -> tuple[int, dict[str, str]]:
    """``counters.lua``'s reply: when the shard's marks began (epoch ms) and its stats
    hash, as HGETALL gives it, with every total at its monotone figure."""
    began, flat = reply
    text = [item.decode() if isinstance(item, bytes) else str(item) for item in flat]
    return int(began), dict(zip(text[::2], text[1::2], strict=True))
