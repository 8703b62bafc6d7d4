"""Checks on what callers pass in, with errors that say what is wrong and how to fix it."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from .keys import validate_job_id, validate_new_job_id, validate_queue_name

MIN_PRIORITY = -100
MAX_PRIORITY = 100
#: Every time django-delayq stores is epoch milliseconds in this range: after the epoch
#: (0 is read as "no time") up to 9998-12-31T00:00Z. In every time zone (up to +14:00)
#: that is still year 9998, so whatever a reader computes from it (the end of its day,
#: month or year, as the admin's date drill-down does) stays within Python's datetime,
#: which ends with year 9999, and within the databases' timestamp columns.
MIN_TIME_MS = 1
MAX_TIME_MS = 253_370_678_400_000  # 9998-12-31T00:00:00.000Z
#: The longest delay: 100 years (a timestamp passed as a delay is refused, not stored).
MAX_DELAY_SECONDS = 100 * 365 * 86_400
#: The most runs a job may be allowed (fits every database's integer column).
MAX_ATTEMPTS = 10_000

__all__ = [
    "InvalidTime",
    "check_max_attempts",
    "check_priority",
    "check_task_name",
    "check_time_ms",
    "delay_ms",
    "run_at_ms",
    "timeout_ms",
    "validate_job_id",
    "validate_new_job_id",
    "validate_queue_name",
]


def check_priority(priority: Any) -> int:
    """Return ``priority`` if it is an int from -100 to 100 (higher runs first)."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int from {MIN_PRIORITY} to {MAX_PRIORITY}, "
                        f"not {type(priority).__name__}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"priority {priority} is out of range: use {MIN_PRIORITY} to "
                         f"{MAX_PRIORITY} (higher runs first)")
    return priority


def check_max_attempts(max_attempts: Any) -> int:
    """Return ``max_attempts`` if it is an int from 1 to :data:`MAX_ATTEMPTS`."""
    if (isinstance(max_attempts, bool) or not isinstance(max_attempts, int)
            or not 1 <= max_attempts <= MAX_ATTEMPTS):
        shown = repr(max_attempts)[:40]
        raise ValueError(f"max_attempts must be an int from 1 to {MAX_ATTEMPTS}, not {shown}")
    return max_attempts


class InvalidTime(ValueError):
    """A time outside the range django-delayq stores (see :data:`MAX_TIME_MS`)."""


def check_time_ms(ms: int, what: str = "time") -> int:
    """Return ``ms`` if it lies in the stored range, else raise :class:`InvalidTime`."""
    if not MIN_TIME_MS <= ms <= MAX_TIME_MS:
        raise InvalidTime(f"{what} is out of range: use a time after 1970-01-01T00:00:00Z "
                          "and no later than 9998-12-31T00:00:00Z")
    return ms


def check_task_name(name: Any) -> str:
    """Return ``name`` if it is a plausible task name (a non-empty dotted path)."""
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
        raise ValueError(f"invalid task name {name!r}")
    return name


def run_at_ms(run_at: Any) -> int:
    """An aware datetime as epoch milliseconds, rounded up so a job never runs early."""
    if not isinstance(run_at, dt.datetime):
        raise TypeError(f"run_at must be an aware datetime, not {type(run_at).__name__}")
    if run_at.tzinfo is None or run_at.utcoffset() is None:
        raise ValueError(
            f"run_at {run_at.isoformat()} is a naive datetime: pass an aware one, e.g. "
            "django.utils.timezone.now() + timedelta(...) or datetime(..., tzinfo=UTC)"
        )
    try:
        # round to whole microseconds first: float noise must not push an exact ms up by one
        ms = math.ceil(round(run_at.timestamp() * 1000, 3))
    except (OverflowError, ValueError):
        ms = 0
    return check_time_ms(ms, f"run_at {run_at.isoformat()}")


def _seconds(value: Any, name: str) -> float:
    """Seconds (int or float) or a timedelta, as float seconds (range not checked)."""
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"{name} must be seconds (int or float) or a timedelta, "
                    f"not {type(value).__name__}")


def timeout_ms(timeout: Any) -> int:
    """A time limit in seconds (int or float) or a timedelta, as milliseconds (at least 1)."""
    seconds = _seconds(timeout, "timeout")
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"timeout must be a finite number of seconds above 0, not {timeout!r}")
    return max(1, math.ceil(seconds * 1000))


def delay_ms(delay: Any) -> int:
    """A delay in seconds (int or float) or a timedelta, as milliseconds (rounded up)."""
    seconds = _seconds(delay, "delay")
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DELAY_SECONDS:
        raise ValueError(f"delay must be zero or more seconds, at most {MAX_DELAY_SECONDS} "
                         f"(100 years), not {delay!r}")
    return math.ceil(seconds * 1000)
