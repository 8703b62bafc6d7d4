"""Watching the wake-up markers of shards that live in different Redis Cluster slots.

A worker idles on its queues' marker ZSETs with one BZPOPMIN. On a cluster, one
blocking command may only name keys of one slot, so :class:`MarkerWatch` keeps one
thread per marker, each blocking on its own key while the worker is idle, and wakes
the worker when any of them pops a mark.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from ...engine import Broker
from ...engine.logfields import log
from ...engine.markers import wait_for_mark
from ..backoff import CALL_FAILED

logger = logging.getLogger("django_delayq.worker")

#: Longest single BZPOPMIN of a watcher thread, in seconds (it re-checks for stop).
WATCH_SLICE = 1.0


class MarkerWatch:
    """One blocking watcher thread per marker key; :meth:`wait` returns on any mark."""

    def __init__(self, broker: Broker, markers: Sequence[str], stop: threading.Event) -> None:
        self._broker = broker
        self._markers = list(dict.fromkeys(markers))
        self._stop = stop
        self._idle = threading.Event()
        self._woken = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i, key in enumerate(self._markers):
            thread = threading.Thread(target=self._watch, args=(key,),
                                      name=f"delayq-marker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def wait(self, timeout: float) -> None:
        """Block until a marker is popped, ``timeout`` passes or the worker stops."""
        if not self._threads:
            self.start()
        self._idle.set()
        try:
            self._woken.wait(timeout)
        finally:
            self._idle.clear()
            self._woken.clear()

    def wake(self) -> None:
        """End a :meth:`wait` now."""
        self._woken.set()

    def _watch(self, key: str) -> None:
        while not self._stop.is_set():
            if not self._idle.wait(0.5):
                continue
            try:
                popped = wait_for_mark(self._broker, [key], WATCH_SLICE)
            except CALL_FAILED as exc:
                log(logger, logging.WARNING, "marker watch failed", key=key, error=exc)
                self._stop.wait(0.5)
                continue
            if popped:
                self._woken.set()
