"""The one backoff policy: a wait that doubles after each failure, up to a cap.

Every loop that waits for Redis (or a database) to come back, every enqueue retried
through a failover, and every worker process restarted after a quick death waits
:func:`backoff_delay`; :class:`Backoff` keeps a loop's count for it.
"""

from __future__ import annotations

import threading


def backoff_delay(failures: int, *, first: float, cap: float) -> float:
    """The wait after the ``failures``-th failure in a row (1: ``first``), doubled each
    time, at most ``cap`` seconds."""
    return float(min(cap, first * 2.0 ** min(max(0, failures - 1), 62)))


class Backoff:
    """Waits ``first`` seconds, doubling after each wait up to ``cap``; :meth:`reset`
    starts over. A wait is cut short when ``stop`` is set."""

    def __init__(self, stop: threading.Event, *, first: float, cap: float) -> None:
        self._stop = stop
        self._first = first
        self._cap = cap
        self._failures = 1

    @property
    def delay(self) -> float:
        """The next wait, in seconds."""
        return backoff_delay(self._failures, first=self._first, cap=self._cap)

    def reset(self) -> None:
        self._failures = 1

    def wait(self) -> None:
        """Sleep the current delay (cut short by ``stop``), then double it."""
        self._stop.wait(self.delay)
        self._failures += 1
