"""Periodic tasks: occurrences planned the same by every worker, each enqueued once."""

from __future__ import annotations

import datetime as dt
import itertools
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_delayq import Job, Queue, task
from django_delayq.runtime.periodic import schedule_due
from django_delayq.runtime.schedule import Schedule, occurrence_id, plan
from tests.conftest import ran, wait_until
from tests.test_flow_control import start_workers, stop_workers

MINUTE = 60_000


def test_every_is_aligned_on_the_epoch_and_plans_the_lookahead():
    every = Schedule.build(None, dt.timedelta(seconds=15), None)
    assert plan(every, None, 100_000, 40_000) == [105_000, 120_000, 135_000]
    # already enqueued up to 120 s: only what lies beyond the mark
    assert plan(every, 120_000, 100_000, 40_000) == [135_000]


def test_cron_follows_its_time_zone():
    paris = Schedule.build("0 9 * * *", None, "Europe/Paris")
    winter = dt.datetime(2026, 1, 10, 12, tzinfo=dt.UTC)
    nxt = paris.next_after(int(winter.timestamp() * 1000))
    assert dt.datetime.fromtimestamp(nxt / 1000, dt.UTC) == dt.datetime(2026, 1, 11, 8,
                                                                        tzinfo=dt.UTC)
    summer = dt.datetime(2026, 7, 10, 12, tzinfo=dt.UTC)
    nxt = paris.next_after(int(summer.timestamp() * 1000))
    assert dt.datetime.fromtimestamp(nxt / 1000, dt.UTC) == dt.datetime(2026, 7, 11, 7,
                                                                        tzinfo=dt.UTC)


@pytest.mark.parametrize(("policy", "expected_late"), [
    ("latest", [9 * MINUTE]), ("all", [7 * MINUTE, 8 * MINUTE, 9 * MINUTE]), ("skip", []),
])
def test_missed_occurrences_follow_the_policy(policy, expected_late):
    every_minute = Schedule.build("* * * * *", None, None)
    # enqueued up to minute 4, no worker ran until 9:30
    got = plan(every_minute, 4 * MINUTE, 9 * MINUTE + 30_000, 45_000, missed=policy,
               catch_up_max=3)
    assert got == [*expected_late, 10 * MINUTE]


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cron": "* * *"}, "invalid cron"), ({"every": 0}, "at least 0.1"),
    ({"cron": "* * * * *", "every": 5}, "not both"), ({"every": 5, "tz": "UTC"}, "tz="),
    ({"cron": "* * * * *", "tz": "Mars/Olympus"}, "unknown time zone"),
    ({"cron": "0 0 31 2 *"}, "never fires"), ({"cron": "0 0 1 1 * 0 2020"}, "never fires"),
    ({"cron": "R * * * *"}, "random fields"), ({"cron": "0 R(0-3) * * *"}, "random fields"),
])
def test_bad_schedules_are_refused_at_declaration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        task(name="tests.bad_schedule", **kwargs)(lambda: None)


@pytest.mark.parametrize(("cron", "tz", "night"), [
    ("30 2 * * *", "Europe/Paris", dt.datetime(2026, 10, 24, 12, tzinfo=dt.UTC)),
    ("30 1 * * *", "America/New_York", dt.datetime(2026, 10, 31, 12, tzinfo=dt.UTC)),
    ("30 1 * * * 0", "America/New_York", dt.datetime(2026, 10, 31, 12, tzinfo=dt.UTC)),
])
def test_a_fixed_time_runs_once_in_the_night_the_clock_goes_back(cron, tz, night):
    """02:30 in Paris happens twice on 25 October 2026; cron runs a job set for it once.
    Both ways of walking the occurrences agree."""
    schedule = Schedule.build(cron, None, tz)
    ahead = [int(night.timestamp() * 1000)]
    for _ in range(3):
        ahead.append(schedule.next_after(ahead[-1]))
    times = ahead[1:]
    assert [b - a for a, b in itertools.pairwise(times)] == [25 * 3_600_000, 24 * 3_600_000]
    back = [schedule.latest_at_or_before(times[-1])]
    for _ in range(2):
        back.append(schedule.latest_at_or_before(back[-1] - 1))
    assert back[::-1] == times


@pytest.mark.parametrize("cron", ["*/30 * * * *", "0,30 * * * * 0"])
def test_a_period_runs_in_both_passes_of_the_hour_the_clock_goes_back(cron):
    half_hourly = Schedule.build(cron, None, "Europe/Paris")
    start = int(dt.datetime(2026, 10, 24, 23, 45, tzinfo=dt.UTC).timestamp() * 1000)
    times = [half_hourly.next_after(start)]
    for _ in range(5):
        times.append(half_hourly.next_after(times[-1]))
    assert {b - a for a, b in itertools.pairwise(times)} == {30 * 60_000}


def test_cron_without_croniter_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "croniter", None)
    with pytest.raises(ImproperlyConfigured, match=r"django-delayq\[cron\]"):
        task(name="tests.needs_croniter", cron="*/5 * * * *")(lambda: None)


def test_occurrence_ids_are_valid_job_ids_for_any_task_name():
    assert occurrence_id("shop.tasks.report", 60_000) == "cron:shop.tasks.report:60000"
    odd = occurrence_id("shop tasks/rapport été", 60_000)
    assert odd.startswith("cron:")
    assert odd.endswith(":60000")
    assert " " not in odd


def _tick_task():
    def tick() -> None:
        pass
    tick.__qualname__ = "tick"
    return task(name="tests.tick_every_minute", queue="periodic",
                every=dt.timedelta(minutes=1))(tick)


def test_schedule_step_runs_a_missed_occurrence_once_and_plans_ahead(broker, redis_client):
    from django_delayq.task import registry

    tick = _tick_task()
    try:
        now = broker.server_time_ms()
        # the last occurrence enqueued was an hour ago: 59 or 60 were missed since
        redis_client.hset(broker.global_keys.schedules, tick.name, now - 60 * MINUTE)
        added = schedule_due(broker, [tick], lookahead_ms=3 * MINUTE, missed="latest")
        again = schedule_due(broker, [tick], lookahead_ms=3 * MINUTE, missed="latest")
    finally:
        registry._tasks.pop(tick.name)  # tasks are fixed at start-up: no public way
    assert (added, again) == (4, 0), "the missed one plus three ahead, then nothing new"
    counts = Queue("periodic").counts()
    assert (counts["ready"], counts["scheduled"]) == (1, 3)
    latest_missed = now // MINUTE * MINUTE
    job = Job.fetch(occurrence_id(tick.name, latest_missed), "periodic")
    assert job.status == "ready"
    assert job.args == []
    assert job.task_name == tick.name


def test_a_schedule_that_fails_keeps_no_other_task_from_running(broker, caplog):
    """One task's schedule raising (a cron croniter cannot walk) is logged, and the
    tasks after it are scheduled as usual."""
    from django_delayq.task import registry

    tick = _tick_task()
    broken = task(name="tests.broken_cron", queue="periodic", cron="0 9 * * *")(lambda: None)
    object.__setattr__(broken, "schedule", Schedule(cron="0 0 31 2 *"))
    try:
        added = schedule_due(broker, [broken, tick], lookahead_ms=3 * MINUTE)
    finally:
        registry._tasks.pop(tick.name)
        registry._tasks.pop(broken.name)
    assert added >= 3
    assert Queue("periodic").counts()["scheduled"] == added
    assert "periodic task not scheduled" in caplog.text
    assert "tests.broken_cron" in caplog.text


@pytest.mark.slow
def test_three_workers_run_each_occurrence_exactly_once(settings, redis_client):
    """Three workers, each running the scheduler, for 150 occurrences of a task due every
    200 ms (30 s; the shorter the period, the more often the schedulers race)."""
    period_ms = 200
    occurrences = 150
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {}}
    procs = start_workers(3, "periodic", {"CRON_LOOKAHEAD": 1.5},
                          extra_env={"DELAYQ_TEST_PERIODIC": str(period_ms / 1000)})
    try:
        wait_until(lambda: len(ran(redis_client)) >= occurrences,
                   timeout=occurrences * period_ms / 1000 + 60, interval=0.2,
                   message=f"{occurrences} occurrences of a {period_ms} ms periodic task")
    finally:
        stop_workers(procs)
    runs = [r for r in ran(redis_client) if r["task"] == "periodic_tick"]
    done = Queue("periodic").jobs("completed", limit=10_000)
    times = sorted(int(j.id.rsplit(":", 1)[1]) for j in done)
    assert all(j.id.startswith("cron:tests.periodic_tick:") for j in done)
    assert len(runs) == len(done) >= occurrences, "one run per occurrence"
    assert times == list(range(times[0], times[-1] + 1, period_ms)), "no gap, no duplicate"
    for job in done:
        assert job.attempts == 1
        assert job.started_at >= job.run_at
    assert len({r["pid"] for r in runs}) >= 2, "several workers ran them"
