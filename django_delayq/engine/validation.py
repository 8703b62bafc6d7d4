"""Checks on what callers pass in, with errors that say what is wrong and how to fix it."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from .keys import validate_job_id, validate_queue_name

MIN_PRIORITY = -100
MAX_PRIORITY = 100

__all__ = [
    "check_max_attempts",
    "check_priority",
    "check_task_name",
    "delay_ms",
    "run_at_ms",
    "validate_job_id",
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
    """Return ``max_attempts`` if it is an int of at least 1."""
    if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
        raise ValueError(f"max_attempts must be an int of at least 1, not {max_attempts!r}")
    return max_attempts


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
    # round to whole microseconds first: float noise must not push an exact ms up by one
    return math.ceil(round(run_at.timestamp() * 1000, 3))


def delay_ms(delay: Any) -> int:
    """A delay in seconds (int or float) or a timedelta, as milliseconds (rounded up)."""
    if isinstance(delay, dt.timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, int | float) and not isinstance(delay, bool):
        seconds = float(delay)
    else:
        raise TypeError(f"delay must be seconds (int or float) or a timedelta, "
                        f"not {type(delay).__name__}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"delay must be zero or more seconds, not {delay!r}")
    return math.ceil(seconds * 1000)
