"""A periodic task whose schedule a deploy changes: the mark and the jobs the old
schedule left meet the new one. The schedulers run on a clock the test sets (Redis time
as they read it), a few days ahead, so every job they enqueue waits as scheduled."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from django_delayq import Job, JobNotFound, Queue
from django_delayq.runtime.periodic import Scheduler
from django_delayq.runtime.schedule import Schedule, occurrence_id

NAME = "tests.report"
SECOND, MINUTE, HOUR, DAY = 1_000, 60_000, 3_600_000, 86_400_000


@dataclass(frozen=True)
class Periodic:
    """A periodic task as the scheduler reads it; two of one name: before and after."""

    schedule: Schedule
    name: str = NAME
    queue_name: str = "periodic"
    priority: int = 0
    attempts_allowed: int = 1
    timeout: float | None = None
    func: Callable[..., Any] = print

    def retry_delay(self, attempt: int) -> float:
        return 0.0


def cron(expr: str) -> Periodic:
    schedule = Schedule.build(expr, None, None)
    assert schedule is not None
    return Periodic(schedule)


def every(seconds: int) -> Periodic:
    schedule = Schedule.build(None, dt.timedelta(seconds=seconds), None)
    assert schedule is not None
    return Periodic(schedule)


class Clock:
    """What the schedulers read as Redis time: day ``d`` at a time, in a day to come."""

    def __init__(self, broker: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.day = (broker.server_time_ms() // DAY + 2) * DAY
        self.ms = self.day
        monkeypatch.setattr(broker, "server_time_ms", lambda: self.ms)

    def at(self, hh: int, mm: int, ss: int = 0, d: int = 0) -> int:
        return self.day + d * DAY + hh * HOUR + mm * MINUTE + ss * SECOND


@pytest.fixture
def clock(broker, monkeypatch):
    return Clock(broker, monkeypatch)


def scheduler(broker, task: Periodic, missed: str = "latest") -> Scheduler:
    return Scheduler(broker, [task], lookahead=30.0, missed=missed, catch_up_max=100)


def step(clock: Clock, ms: int, *schedulers: Scheduler) -> None:
    clock.ms = ms
    for s in schedulers:
        s.step()


def status(at_ms: int) -> str | None:
    """The status of the occurrence at ``at_ms``'s job; None: never enqueued."""
    try:
        return Job.fetch(occurrence_id(NAME, at_ms), "periodic").status
    except JobNotFound:
        return None


def waiting() -> list[int]:
    """The occurrences waiting to run, oldest first."""
    jobs = Queue("periodic").jobs("scheduled", limit=1_000)
    return sorted(int(j.id.rsplit(":", 1)[1]) for j in jobs)


def test_a_coarser_schedule_cancels_the_old_ones_next_job(broker, clock):
    """Every minute, then daily at 03:00: the minute already enqueued does not run, and
    03:00 today (long past at the change) is no missed occurrence to run now."""
    old, new = scheduler(broker, every(60)), scheduler(broker, cron("0 3 * * *"))
    step(clock, clock.at(10, 0, 40), old)
    assert waiting() == [clock.at(10, 1)]
    step(clock, clock.at(10, 0, 45), new)
    assert status(clock.at(10, 1)) == "cancelled"
    assert status(clock.at(3, 0)) is None
    assert waiting() == []
    step(clock, clock.at(2, 59, 45, d=1), new)
    assert waiting() == [clock.at(3, 0, d=1)]


@pytest.mark.parametrize("missed", ["latest", "all"])
def test_a_finer_schedule_runs_no_catch_up_for_times_before_it_existed(broker, clock,
                                                                       missed):
    """Daily at 03:00, then every minute from 10:00:10: the minutes since 03:00 were not
    missed (the schedule did not exist); the first run is at 10:01."""
    old, new = scheduler(broker, cron("0 3 * * *")), scheduler(broker, every(60), missed)
    step(clock, clock.at(2, 59, 45), old)
    step(clock, clock.at(10, 0, 10), new)
    assert waiting() == [clock.at(3, 0)]
    step(clock, clock.at(10, 0, 40), new)
    assert waiting() == [clock.at(3, 0), clock.at(10, 1)]


def test_a_later_time_of_day_is_not_run_at_once_as_missed(broker, clock):
    """Daily at 03:00, then daily at 04:00, changed at 10:00: no run at 10:00 for the
    04:00 the new schedule 'missed' (the task ran at 03:00); the next is tomorrow 04:00."""
    old, new = scheduler(broker, cron("0 3 * * *")), scheduler(broker, cron("0 4 * * *"))
    step(clock, clock.at(2, 59, 45), old)
    step(clock, clock.at(10, 0), new)
    assert status(clock.at(4, 0)) is None
    assert waiting() == [clock.at(3, 0)]
    step(clock, clock.at(3, 59, 45, d=1), new)
    assert waiting() == [clock.at(3, 0), clock.at(4, 0, d=1)]


def test_an_earlier_time_of_day_cancels_the_old_time_already_enqueued(broker, clock):
    """Daily at 04:00, then at 03:00, changed at 03:59:50 with the 04:00 job waiting:
    it does not run; the next run is tomorrow at 03:00."""
    old, new = scheduler(broker, cron("0 4 * * *")), scheduler(broker, cron("0 3 * * *"))
    step(clock, clock.at(3, 59, 45), old)
    assert waiting() == [clock.at(4, 0)]
    step(clock, clock.at(3, 59, 50), new)
    assert status(clock.at(4, 0)) == "cancelled"
    step(clock, clock.at(2, 59, 45, d=1), new)
    assert waiting() == [clock.at(3, 0, d=1)]


def test_a_finer_schedule_skips_none_of_its_times_before_the_old_mark(broker, clock):
    """Hourly, then every 10 s, changed at 10:59:46 with 11:00 enqueued (the mark): the
    new schedule's 10:59:50 runs, and 11:00, a time of both, stays enqueued once."""
    old, new = scheduler(broker, cron("0 * * * *")), scheduler(broker, every(10))
    step(clock, clock.at(10, 59, 45), old)
    step(clock, clock.at(10, 59, 46), new)
    assert waiting() == [clock.at(10, 59, 50), clock.at(11, 0), clock.at(11, 0, 10)]
    assert status(clock.at(11, 0)) == "scheduled"


def test_old_and_new_schedulers_side_by_side_do_not_take_turns(broker, clock):
    """A rolling deploy: processes on the old schedule (every minute) still step after
    the first on the new one (daily at 03:00) started. The newer runs the task; the
    older enqueue nothing more and cancel nothing of the new schedule's."""
    old = scheduler(broker, every(60))
    step(clock, clock.at(10, 0, 30), old)
    new = scheduler(broker, cron("0 3 * * *"))
    step(clock, clock.at(10, 0, 40), old, new)
    for second in (45, 50, 55):
        step(clock, clock.at(10, 0, second), old, new)
    step(clock, clock.at(10, 1, 35), new, old)
    assert status(clock.at(10, 1)) == "cancelled"
    assert status(clock.at(10, 2)) is None
    assert waiting() == []
    restarted = scheduler(broker, every(60))  # an old process that came back: the newest
    step(clock, clock.at(10, 1, 40), restarted, new, old)
    assert waiting() == [clock.at(10, 2)]
    later = scheduler(broker, cron("0 3 * * *"))  # the deploy replaces it
    step(clock, clock.at(10, 1, 45), later, restarted, new, old)
    assert status(clock.at(10, 2)) == "cancelled"
    step(clock, clock.at(2, 59, 45, d=1), restarted, old, new, later)
    assert waiting() == [clock.at(3, 0, d=1)]


def test_a_mark_made_before_schedules_were_recorded_is_of_the_same_schedule(broker, clock,
                                                                             redis_client):
    """A mark an earlier version wrote (no schedule recorded) counts as the task's: its
    missed occurrence runs as before; a change after that is seen as a change."""
    redis_client.hset(broker.global_keys.schedules, NAME, clock.at(9, 0))
    hourly = scheduler(broker, cron("0 * * * *"))
    step(clock, clock.at(10, 0, 20), hourly)
    assert waiting() == [clock.at(10, 0)]
    step(clock, clock.at(10, 59, 45), hourly)
    step(clock, clock.at(10, 59, 50), scheduler(broker, cron("30 11 * * *")))
    assert status(clock.at(11, 0)) == "cancelled"
    assert waiting() == [clock.at(10, 0)]
