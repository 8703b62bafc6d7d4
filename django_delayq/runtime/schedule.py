"""When periodic tasks run: ``@task(cron=...)`` and ``@task(every=...)`` as a
:class:`Schedule`, and which occurrences to enqueue now (:func:`plan`)."""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import time
import zoneinfo
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..engine.errors import ExtraMissing
from ..engine.jobhash import to_int
from ..engine.keys import JOB_ID_RE

MISSED_POLICIES = ("latest", "all", "skip")


def _croniter() -> Any:
    try:  # croniter: the optional extra "cron", imported when a cron schedule is read
        from croniter import croniter

    except ImportError as exc:
        raise ExtraMissing("@task(cron=...)", "croniter", "cron") from exc
    return croniter


@dataclass(frozen=True)
class Schedule:
    """When a periodic task runs: a cron expression in a time zone, or a fixed period.

    A period (``every``) is aligned on the Unix epoch, so every worker computes the
    same occurrences: ``every=timedelta(minutes=5)`` runs at :00, :05, ... UTC.
    """

    cron: str | None = None
    tz: str = "UTC"
    every_ms: int | None = None

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Schedule:
        """The schedule a stored spec names (``cron``, ``tz``, ``every_ms``: a worker's
        registration, a schedule record), unchecked: using it raises ValueError or
        TypeError for one that is damaged."""
        cron = spec.get("cron")
        return cls(cron=cron if isinstance(cron, str) else None,
                   tz=str(spec.get("tz") or "UTC"), every_ms=to_int(spec.get("every_ms"), None))

    @classmethod
    def build(cls, cron: str | None, every: Any, tz: str | None) -> Schedule | None:
        """Validate ``@task`` options; None when the task is not periodic."""
        if cron is None and every is None:
            if tz is not None:
                raise ValueError("tz= only applies with cron=")
            return None
        if cron is not None and every is not None:
            raise ValueError("give cron or every, not both")
        if every is not None:
            if tz is not None:
                raise ValueError("tz= only applies with cron=; every= is aligned on UTC")
            seconds = every.total_seconds() if isinstance(every, dt.timedelta) else every
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
                math.isfinite(seconds) and seconds >= 0.1
            ):
                raise ValueError(f"every must be a timedelta or seconds of at least 0.1, "
                                 f"not {every!r}")
            return cls(every_ms=round(seconds * 1000))
        if not isinstance(cron, str) or not _croniter().is_valid(cron):
            raise ValueError(f"invalid cron expression {cron!r}")
        if any(part.upper() == "R" or part.upper().startswith("R(")
               for field in cron.split() for part in field.split(",")):
            # a random field draws anew for each worker and each step: never the same
            # occurrences, so none is enqueued once
            raise ValueError(f"cron expression {cron!r}: random fields (R) are not "
                             "supported; pick the minute yourself")
        try:
            zoneinfo.ZoneInfo(tz or "UTC")
        except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {tz!r}") from exc
        schedule = cls(cron=cron, tz=tz or "UTC")
        try:  # valid to croniter, yet maybe never due (February 30th, a past year)
            schedule.next_after(int(time.time() * 1000))
        except (ValueError, OverflowError) as exc:
            raise ValueError(f"cron expression {cron!r} never fires: {exc}") from None
        return schedule

    def _repeated(self, at: dt.datetime) -> bool:
        """Whether ``at`` is the second pass of a local time the clock went back over,
        for a cron whose hour field names hours: cron runs those once (a ``*`` hour is a
        period, and runs in both passes)."""
        fields = (self.cron or "").split()
        hour = fields[1] if len(fields) > 1 else "*"  # croniter's seconds come last
        if "*" in hour:
            return False
        zone = zoneinfo.ZoneInfo(self.tz)
        wall = at.astimezone(zone).replace(tzinfo=None)
        first = wall.replace(fold=0, tzinfo=zone).timestamp()
        return (first < at.timestamp()  # an earlier instant shows the same wall time
                and dt.datetime.fromtimestamp(first, zone).replace(tzinfo=None) == wall)

    def _at(self, ms: int) -> dt.datetime:
        return dt.datetime.fromtimestamp(ms / 1000, tz=zoneinfo.ZoneInfo(self.tz))

    def next_after(self, ms: int) -> int:
        """The first occurrence strictly after ``ms`` (epoch ms)."""
        if self.every_ms is not None:
            return (ms // self.every_ms + 1) * self.every_ms
        it = _croniter()(self.cron, self._at(ms))
        nxt: dt.datetime = it.get_next(dt.datetime)
        while self._repeated(nxt):  # the second pass of an hour the clock went back over
            nxt = it.get_next(dt.datetime)
        return math.ceil(nxt.timestamp() * 1000)

    def latest_at_or_before(self, ms: int) -> int:
        """The last occurrence at or before ``ms``."""
        if self.every_ms is not None:
            return ms // self.every_ms * self.every_ms
        it = _croniter()(self.cron, self._at(ms + 1))
        prev: dt.datetime = it.get_prev(dt.datetime)
        while self._repeated(prev):
            prev = it.get_prev(dt.datetime)
        return math.ceil(prev.timestamp() * 1000)

    def describe(self) -> str:
        if self.every_ms is not None:
            return f"every {self.every_ms / 1000:g}s"
        return f"cron {self.cron!r} ({self.tz})"


def occurrence_id(task_name: str, at_ms: int) -> str:
    """The job id of one occurrence: the same in every worker, hence enqueued once."""
    job_id = f"cron:{task_name}:{at_ms}"
    if JOB_ID_RE.match(job_id):
        return job_id
    digest = hashlib.sha1(task_name.encode()).hexdigest()[:20]
    return f"cron:{digest}:{at_ms}"


def plan(schedule: Schedule, last_ms: int | None, now_ms: int, lookahead_ms: int, *,
         missed: str = "latest", catch_up_max: int = 100, limit: int = 10_000) -> list[int]:
    """The occurrences to enqueue now, oldest first.

    Upcoming ones: every occurrence after ``max(last_ms, now_ms)`` up to ``now_ms +
    lookahead_ms`` (at most ``limit``). Missed ones, in ``(last_ms, now_ms]``: the most
    recent (``"latest"``), up to ``catch_up_max`` most recent (``"all"``) or none
    (``"skip"``). A task never marked before has missed nothing.
    """
    if missed not in MISSED_POLICIES:
        raise ValueError(f"missed must be one of {MISSED_POLICIES}, not {missed!r}")
    late: list[int] = []
    if last_ms is not None and missed != "skip":
        keep = 1 if missed == "latest" else catch_up_max
        at = schedule.latest_at_or_before(now_ms)
        while at > last_ms and len(late) < keep:
            late.append(at)
            at = schedule.latest_at_or_before(at - 1)
        late.reverse()
    upcoming: list[int] = []
    at = schedule.next_after(max(now_ms, last_ms or now_ms))
    while at <= now_ms + lookahead_ms and len(upcoming) < limit:
        upcoming.append(at)
        at = schedule.next_after(at)
    return late + upcoming
