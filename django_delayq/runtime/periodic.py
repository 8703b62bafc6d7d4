"""Periodic tasks with no beat process: the occurrences a host enqueues ahead of time.

The host of every ``runworker`` runs :func:`schedule_due` now and then
(:class:`Scheduler`) for the periodic tasks of the queues it serves. It enqueues each
occurrence due within ``CRON_LOOKAHEAD`` seconds as an ordinary scheduled job whose id
is derived from the task and the occurrence time (:func:`~.schedule.occurrence_id`), so
many hosts computing the same occurrence enqueue it once: enqueue skips an id that
exists. A mark per task records the latest occurrence enqueued; occurrences between that
mark and now were missed (nothing ran) and are handled by the ``CRON_MISSED`` policy.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Sequence

from ..engine import Broker, EnqueueRequest
from ..engine.logfields import log
from ..engine.schedules import advance_schedule, register_schedules, schedule_marks
from .backoff import CALL_FAILED
from .registry import Runnable
from .schedule import occurrence_id, plan

logger = logging.getLogger("django_delayq.periodic")


def schedule_due(broker: Broker, tasks: Sequence[Runnable], *, lookahead_ms: int,
                 missed: str = "latest", catch_up_max: int = 100) -> int:
    """Enqueue the upcoming (and missed) occurrences of ``tasks``; returns how many
    new jobs this call added (0 when another worker was first)."""
    added = 0
    now_ms = broker.server_time_ms()
    # what the admin lists: the schedules workers run, not those the web process knows
    register_schedules(broker, {t.name: {
        "queue": t.queue_name, "cron": t.schedule.cron, "tz": t.schedule.tz,
        "every_ms": t.schedule.every_ms, "seen_ms": now_ms}
        for t in tasks if t.schedule is not None})
    marks = schedule_marks(broker, [t.name for t in tasks])
    for task, mark in zip(tasks, marks, strict=True):
        try:
            added += _schedule_task(broker, task, mark, now_ms, lookahead_ms=lookahead_ms,
                                    missed=missed, catch_up_max=catch_up_max)
        except CALL_FAILED:
            raise
        except Exception as exc:  # this task's schedule alone: the others still run
            log(logger, logging.ERROR, "periodic task not scheduled", exc_info=True,
                task=task.name, error=exc)
    return added


def _schedule_task(broker: Broker, task: Runnable, last: int | None, now_ms: int, *,
                   lookahead_ms: int, missed: str, catch_up_max: int) -> int:
    """Enqueue the occurrences of one task after its mark ``last``; how many were new."""
    schedule = task.schedule
    assert schedule is not None
    added = 0
    times = plan(schedule, last, now_ms, lookahead_ms, missed=missed,
                 catch_up_max=catch_up_max)
    if last is not None and times and times[0] <= now_ms:
        log(logger, logging.INFO, "running missed occurrence(s)", task=task.name,
            count=sum(1 for t in times if t <= now_ms), policy=missed)
    if times:
        requests = [
            EnqueueRequest(task=task.name, run_at=dt.datetime.fromtimestamp(t / 1000,
                                                                             tz=dt.UTC),
                           priority=task.priority, job_id=occurrence_id(task.name, t),
                           max_attempts=task.attempts_allowed)
            for t in times
        ]
        added = broker.enqueue_many(task.queue_name, requests).enqueued
    newest = max(times, default=schedule.latest_at_or_before(now_ms))
    advance_schedule(broker, task.name, newest)
    return added


class Scheduler:
    """A host's service: :func:`schedule_due` for ``tasks`` a few times per lookahead."""

    name = "scheduler"

    def __init__(self, broker: Broker, tasks: Sequence[Runnable], *, lookahead: float,
                 missed: str, catch_up_max: int) -> None:
        self.broker = broker
        self.tasks = list(tasks)
        self.lookahead = lookahead
        self.missed = missed
        self.catch_up_max = catch_up_max
        self._stop = threading.Event()

    def run(self) -> None:
        interval = max(0.2, min(10.0, self.lookahead / 3))
        log(logger, logging.INFO, "scheduling periodic tasks", tasks=",".join(
            f"{t.name}({t.schedule.describe()})" for t in self.tasks if t.schedule))
        while not self._stop.is_set():
            try:
                added = schedule_due(self.broker, self.tasks,
                                     lookahead_ms=int(self.lookahead * 1000),
                                     missed=self.missed, catch_up_max=self.catch_up_max)
                if added:
                    log(logger, logging.DEBUG, "enqueued periodic jobs", jobs=added)
            except CALL_FAILED as exc:
                log(logger, logging.WARNING, "periodic scheduling failed", error=exc)
            self._stop.wait(interval)

    def stop(self, *, drain: bool) -> None:
        self._stop.set()
