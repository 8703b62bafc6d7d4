"""Flow control of a queue: how many jobs may start per window, and shard counts.

A :class:`RateLimit` is a sliding window: at most ``limit`` jobs of the queue start in
any ``period_ms`` window, counted over every worker and every shard (the window's
state is one ZSET of start times, ``QueueKeys.limit`` of the queue's unsharded keys).
An interval queue is the same window with ``limit=1``: two starts are never closer
than the interval.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

UNITS_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
RATE_RE = re.compile(r"^\s*(\d+)\s*/\s*(\d+(?:\.\d+)?)?\s*([smhd])\s*$")
#: Most starts one window may count: the window keeps one ZSET entry per start.
MAX_LIMIT = 100_000


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``limit`` job starts in any window of ``period_ms`` milliseconds."""

    limit: int
    period_ms: int

    def __post_init__(self) -> None:
        if not 1 <= self.limit <= MAX_LIMIT:
            raise ValueError(f"a rate limit counts 1 to {MAX_LIMIT} starts, not {self.limit}")
        if self.period_ms < 1:
            raise ValueError(f"a rate limit window lasts at least 1 ms, not {self.period_ms}")


def parse_rate(text: Any) -> RateLimit:
    """``"100/m"``, ``"5/s"``, ``"1000/h"``, ``"10/30s"`` as a :class:`RateLimit`."""
    match = RATE_RE.match(text) if isinstance(text, str) else None
    if not match:
        raise ValueError(f"invalid rate limit {text!r}: write '<count>/<unit>' or "
                         "'<count>/<n><unit>' with unit s, m, h or d, e.g. '100/m', '10/30s'")
    count, amount, unit = match.groups()
    period = float(amount) if amount else 1.0
    return RateLimit(int(count), math.ceil(period * UNITS_MS[unit]))


def interval_limit(seconds: Any) -> RateLimit:
    """An interval queue: one start per ``seconds`` (> 0)."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
        math.isfinite(seconds) and seconds > 0
    ):
        raise ValueError(f"an interval is a number of seconds > 0, not {seconds!r}")
    return RateLimit(1, max(1, math.ceil(seconds * 1000)))


@dataclass(frozen=True, slots=True)
class QueueOptions:
    """Per-queue engine options: shard count and an optional start limit."""

    shards: int = 1
    limit: RateLimit | None = None


def queue_options(spec: Any) -> QueueOptions:
    """Build :class:`QueueOptions` from a settings dict: ``shards``, ``rate_limit``,
    ``interval`` (``rate_limit`` and ``interval`` exclude each other)."""
    if not isinstance(spec, dict):
        raise ValueError(f"queue options are a dict, not {type(spec).__name__}")
    unknown = set(spec) - {"shards", "rate_limit", "interval"}
    if unknown:
        raise ValueError(f"unknown queue options {sorted(unknown)}: use shards, rate_limit, "
                         "interval")
    shards = spec.get("shards", 1)
    if isinstance(shards, bool) or not isinstance(shards, int) or not 1 <= shards <= 1024:
        raise ValueError(f"shards is an int from 1 to 1024, not {shards!r}")
    rate, interval = spec.get("rate_limit"), spec.get("interval")
    if rate is not None and interval is not None:
        raise ValueError("give rate_limit or interval, not both")
    limit = parse_rate(rate) if rate is not None else (
        interval_limit(interval) if interval is not None else None
    )
    return QueueOptions(shards=shards, limit=limit)
