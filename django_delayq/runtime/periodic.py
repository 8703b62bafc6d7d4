"""Periodic tasks with no beat process: the occurrences a host enqueues ahead of time.

The host of every ``runworker`` runs :func:`schedule_due` now and then
(:class:`Scheduler`) for the periodic tasks of the queues it serves. It enqueues each
occurrence due within ``CRON_LOOKAHEAD`` seconds as an ordinary scheduled job whose id
is derived from the task and the occurrence time (:func:`~.schedule.occurrence_id`), so
many hosts computing the same occurrence enqueue it once: enqueue skips an id that
exists. A mark per task records the latest occurrence enqueued; occurrences between that
mark and now were missed (nothing ran) and are handled by the ``CRON_MISSED`` policy.

Next to the mark, the task's record names the schedule it was made under (a tag: a
hash of the schedule and queue). A scheduler whose schedule differs from the record's
takes over when it started after the schedulers of the record's (a deploy changed it):
it plans as for a new task (from now on, nothing missed), sets the mark, and cancels the
jobs of the old schedule still to come that its own would not run. The older
schedulers then hold off (:func:`~..engine.schedules.hold_schedule`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import threading
from collections.abc import Sequence

from ..engine import Broker, EnqueueRequest, Job, JobNotFound
from ..engine.logfields import log
from ..engine.schedules import advance_schedule, held_schedule, hold_schedule, register_schedules
from .backoff import CALL_FAILED
from .registry import Runnable
from .schedule import Schedule, occurrence_id, plan

logger = logging.getLogger("django_delayq.periodic")


def schedule_due(broker: Broker, tasks: Sequence[Runnable], *, lookahead_ms: int,
                 missed: str = "latest", catch_up_max: int = 100,
                 since_ms: int | None = None) -> int:
    """Enqueue the upcoming (and missed) occurrences of ``tasks``; returns how many
    new jobs this call added (0 when another worker was first).

    ``since_ms``: when the calling scheduler started (default: now); of two schedulers
    running different schedules of a task, the one started later runs it.
    """
    added = 0
    now_ms = broker.server_time_ms()
    # what the admin lists: the schedules workers run, not those the web process knows
    register_schedules(broker, {t.name: {**_spec(t), "seen_ms": now_ms}
                                for t in tasks if t.schedule is not None})
    for task in tasks:
        try:
            added += _schedule_task(broker, task, now_ms, now_ms if since_ms is None
                                    else since_ms, lookahead_ms=lookahead_ms,
                                    missed=missed, catch_up_max=catch_up_max)
        except CALL_FAILED:
            raise
        except Exception as exc:  # this task's schedule alone: the others still run
            log(logger, logging.ERROR, "periodic task not scheduled", exc_info=True,
                task=task.name, error=exc)
    return added


def _spec(task: Runnable) -> dict[str, object]:
    schedule = task.schedule
    assert schedule is not None
    return {"queue": task.queue_name, "cron": schedule.cron, "tz": schedule.tz,
            "every_ms": schedule.every_ms}


def schedule_tag(spec: dict[str, object]) -> str:
    """A short hash of a task's schedule and queue: what its mark was made under."""
    if isinstance(spec.get("cron"), str):
        spec = {**spec, "cron": " ".join(str(spec["cron"]).split())}
    text = json.dumps(spec, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def _schedule_task(broker: Broker, task: Runnable, now_ms: int, since_ms: int, *,
                   lookahead_ms: int, missed: str, catch_up_max: int) -> int:
    """Enqueue the occurrences of one task after its mark; how many were new."""
    schedule = task.schedule
    assert schedule is not None
    spec = _spec(task)
    tag = schedule_tag(spec)
    hold = hold_schedule(broker, task.name, tag=tag, spec=spec, since_ms=since_ms,
                         now_ms=now_ms, stale_ms=max(60_000, 4 * lookahead_ms),
                         switch_mark_ms=schedule.latest_at_or_before(now_ms))
    if hold.state == "held":
        log(logger, logging.DEBUG, "periodic task runs on a newer schedule",
            task=task.name, schedule=schedule.describe())
        return 0
    last = hold.mark
    if hold.state == "switch":
        # a new schedule missed nothing: it starts now, as a task never scheduled before
        last = schedule.latest_at_or_before(now_ms)
        cancelled = _cancel_replaced(broker, task, hold.spec, hold.mark, now_ms)
        log(logger, logging.INFO, "periodic schedule changed", task=task.name,
            schedule=schedule.describe(), cancelled=cancelled)
    added = 0
    times = plan(schedule, last, now_ms, lookahead_ms, missed=missed,
                 catch_up_max=catch_up_max)
    if last is not None and times and times[0] <= now_ms:
        log(logger, logging.INFO, "running missed occurrence(s)", task=task.name,
            count=sum(1 for t in times if t <= now_ms), policy=missed)
    new_ids: list[str] = []
    if times:
        requests = [
            EnqueueRequest(task=task.name, run_at=dt.datetime.fromtimestamp(t / 1000,
                                                                             tz=dt.UTC),
                           priority=task.priority, job_id=occurrence_id(task.name, t),
                           max_attempts=task.attempts_allowed)
            for t in times
        ]
        result = broker.enqueue_many(task.queue_name, requests)
        added = result.enqueued
        taken = set(result.duplicate_ids)
        new_ids = [i for i in result.job_ids if i not in taken]
    newest = max(times, default=schedule.latest_at_or_before(now_ms))
    if not advance_schedule(broker, task.name, newest, tag=tag):
        # replaced while this step enqueued: take back what the new schedule won't run
        _take_back(broker, task, held_schedule(broker, task.name), new_ids)
        return 0
    return added


def _occurs(spec: dict[str, object] | None, queue: str, at_ms: int) -> bool:
    """Whether the schedule ``spec`` runs an occurrence at ``at_ms`` in ``queue``."""
    if spec is None or spec.get("queue") != queue:
        return False
    try:
        schedule = Schedule.from_spec(spec)
        return schedule.latest_at_or_before(at_ms) == at_ms
    except (TypeError, ValueError):
        return False


def _cancel_replaced(broker: Broker, task: Runnable, old: dict[str, object] | None,
                     old_mark: int | None, now_ms: int) -> int:
    """Cancel the jobs the replaced schedule ``old`` enqueued after now (up to its mark)
    that the task's new schedule does not run; how many."""
    if old is None or old_mark is None or old_mark <= now_ms:
        return 0
    try:
        schedule = Schedule.from_spec(old)
    except (TypeError, ValueError):
        return 0
    queue = str(old.get("queue") or task.queue_name)
    ids = []
    at = schedule.next_after(now_ms)
    while at <= old_mark:
        if not _occurs(_spec(task), queue, at):
            ids.append(occurrence_id(task.name, at))
        at = schedule.next_after(at)
    return _cancel(broker, queue, ids)


def _take_back(broker: Broker, task: Runnable, holder: dict[str, object] | None,
               ids: list[str]) -> None:
    """Cancel the jobs ``ids`` this scheduler just added for ``task`` that the schedule
    now in effect (``holder``) does not run."""
    gone = [i for i in ids if not _occurs(holder, task.queue_name, int(i.rsplit(":", 1)[1]))]
    _cancel(broker, task.queue_name, gone)
    log(logger, logging.INFO, "periodic task runs on a newer schedule", task=task.name,
        cancelled=len(gone))


def _cancel(broker: Broker, queue: str, ids: list[str]) -> int:
    cancelled = 0
    for job_id in ids:
        try:
            cancelled += Job(id=job_id, queue=queue, broker=broker).cancel()
        except JobNotFound:
            continue  # never enqueued, or gone
    return cancelled


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
        #: When this scheduler first stepped (ms, Redis clock): of two schedulers that
        #: run different schedules of a task, the later one's runs it.
        self.since_ms: int | None = None

    def step(self) -> int:
        """One pass: :func:`schedule_due` for the tasks; how many jobs it added."""
        if self.since_ms is None:
            self.since_ms = self.broker.server_time_ms()
        return schedule_due(self.broker, self.tasks, lookahead_ms=int(self.lookahead * 1000),
                            missed=self.missed, catch_up_max=self.catch_up_max,
                            since_ms=self.since_ms)

    def run(self) -> None:
        interval = max(0.2, min(10.0, self.lookahead / 3))
        log(logger, logging.INFO, "scheduling periodic tasks", tasks=",".join(
            f"{t.name}({t.schedule.describe()})" for t in self.tasks if t.schedule))
        while not self._stop.is_set():
            try:
                added = self.step()
                if added:
                    log(logger, logging.DEBUG, "enqueued periodic jobs", jobs=added)
            except CALL_FAILED as exc:
                log(logger, logging.WARNING, "periodic scheduling failed", error=exc)
            self._stop.wait(interval)

    def stop(self, *, drain: bool) -> None:
        self._stop.set()
