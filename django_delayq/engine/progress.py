"""Progress a running job reports: a fraction (0..1) and a message, kept in its hash.

A task may report progress in a tight loop, so :class:`ProgressReporter` writes only
what a reader could tell apart: a new whole percent or a new message, at most every
``interval`` seconds (the first report, 100 % and a new message are written at once).
A write is one script call (an HSET, and a ``progress`` event for the mirror). A report
the interval deferred is written by :meth:`ProgressReporter.flush` when the task
returns, so the last report always lands.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from .codec import cut_utf8

if TYPE_CHECKING:
    from .broker import Broker
    from .claims import ClaimedJob

def check_progress(fraction: float, message: str, limit: int) -> tuple[float, str]:
    """``(fraction, message)`` checked: a real number in 0..1 and a string (cut to
    ``limit`` bytes, ``PROGRESS_MAX_BYTES``). Raises TypeError or ValueError otherwise."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise TypeError(f"progress must be a number from 0 to 1, not {fraction!r}")
    if not math.isfinite(fraction) or not 0 <= fraction <= 1:
        raise ValueError(f"progress must be from 0 to 1, not {fraction!r}")
    if not isinstance(message, str):
        raise TypeError(f"the progress message must be a str, not {type(message).__name__}")
    return float(fraction), cut_utf8(message, limit)


class ProgressReporter:
    """Writes one running job's progress to Redis, skipping reports nobody could see."""

    def __init__(self, broker: Broker, job: ClaimedJob, *, interval: float = 0.1) -> None:
        self._broker = broker
        self._job = job
        self._interval = interval
        self._written: tuple[int, str] | None = None  # (whole percent, message) last written
        self._written_at = -math.inf
        self._pending: tuple[float, str] | None = None  # a report deferred
        self.writes = 0

    def report(self, fraction: float, message: str = "") -> bool:
        """Record ``fraction`` and ``message`` if they differ enough from the last write.
        Returns whether this call wrote (False too when the job lost its lease)."""
        fraction, message = check_progress(fraction, message,
                                           self._broker.config.progress_max_bytes)
        percent = math.floor(fraction * 100)
        now = time.monotonic()
        if self._written is not None:
            old_percent, old_message = self._written
            if (percent, message) == (old_percent, old_message):
                return False
            urgent = message != old_message or percent == 100
            if not urgent and now - self._written_at < self._interval:
                self._pending = (fraction, message)
                return False
        self._written, self._written_at = (percent, message), now
        return self._write(fraction, message)

    def flush(self) -> bool:
        """Write the report the interval deferred, if any (the task has returned)."""
        if self._pending is None:
            return False
        fraction, message = self._pending
        self._written = (math.floor(fraction * 100), message)
        return self._write(fraction, message)

    def _write(self, fraction: float, message: str) -> bool:
        self._pending = None
        broker, job = self._broker, self._job
        with broker.connection_errors():
            done = broker.commands.progress(job.keys, job.id, job.attempt, fraction, message)
        self.writes += 1
        return bool(done)
