"""A progress line for long Spark jobs, from the driver's status tracker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any


class Progress:
    """While open, calls ``write(text)`` when the running stages' task counts change.

    ``text`` reads ``"partitions 3/8 done, 2 running"``. Use as a context manager around
    the Spark action; it polls ``SparkContext.statusTracker()`` every ``interval`` s.
    """

    def __init__(self, spark_context: Any, write: Callable[[str], None],
                 interval: float = 0.5) -> None:
        self._tracker = spark_context.statusTracker()
        self._write = write
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="delayq-spark-progress",
                                        daemon=True)
        self._last = ""

    def snapshot(self) -> str | None:
        total = done = running = 0
        for stage_id in self._tracker.getActiveStageIds():
            info = self._tracker.getStageInfo(stage_id)
            if info is None:
                continue
            total += info.numTasks
            done += info.numCompletedTasks
            running += info.numActiveTasks
        if not total:
            return None
        return f"partitions {done}/{total} done, {running} running"

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                text = self.snapshot()
            except Exception:  # the context is stopping; progress is best effort
                return
            if text and text != self._last:
                self._last = text
                self._write(text)

    def __enter__(self) -> Progress:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
