"""Running totals and histograms the scripts keep per queue shard, for metrics.

Each shard's stats HASH (``{dq:Q}:stats``) holds, next to its per-minute counters:
``e`` jobs enqueued, ``du`` enqueues skipped as duplicates, ``c`` completed, ``f``
dead-lettered (failed for good), ``r`` failed attempts retried, and two histograms
(bucket fields ``NAME:i``, sum ``NAME:sum``, in ms): ``hd`` the run time of completed
jobs, ``hl`` the start lateness of every start (its count is the number of jobs
started). The readers' marks (``m:...``) keep the totals shown from going back after a
failover (``lua/counters.lua``, through which
:func:`~django_delayq.engine.overview.summaries` reads each shard: one script call,
whatever the number of jobs).
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Upper bounds (ms) of the histogram buckets; ``lua/includes/histogram.lua`` repeats them.
HISTOGRAM_MS = (5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000)

TOTALS = {"e": "enqueued", "c": "completed", "f": "failed", "r": "retried"}


@dataclass
class Histogram:
    """Per-bucket counts (not cumulative; the last bucket has no upper bound) and the sum."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(HISTOGRAM_MS) + 1))
    sum_ms: int = 0

    @property
    def count(self) -> int:
        return sum(self.buckets)

    def cumulative(self) -> list[tuple[str, int]]:
        """Prometheus buckets: ``(upper bound in seconds, count of values <= it)``."""
        out, running = [], 0
        for bound, n in zip([*(f"{ms / 1000:g}" for ms in HISTOGRAM_MS), "+Inf"],
                            self.buckets, strict=True):
            running += n
            out.append((bound, running))
        return out


@dataclass
class QueueStats:
    """Totals since the queue's stats began, and the two histograms."""

    enqueued: int = 0
    completed: int = 0
    failed: int = 0
    retried: int = 0
    duration: Histogram = field(default_factory=Histogram)
    lateness: Histogram = field(default_factory=Histogram)

    @property
    def started(self) -> int:
        return self.lateness.count

    def add(self, stored: dict[str, str]) -> None:
        """Add one shard's stats hash (HGETALL's answer); unknown fields are ignored."""
        for name, value in stored.items():
            try:
                number = int(value)
            except ValueError:
                continue
            if name in TOTALS:
                setattr(self, TOTALS[name], getattr(self, TOTALS[name]) + number)
                continue
            kind, _, index = name.partition(":")
            histogram = {"hd": self.duration, "hl": self.lateness}.get(kind)
            if histogram is None:
                continue
            if index == "sum":
                histogram.sum_ms += number
            elif index.isdecimal() and 1 <= int(index) <= len(histogram.buckets):
                histogram.buckets[int(index) - 1] += number
