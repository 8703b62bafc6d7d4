"""The job the current thread is running, for code that needs to know (``current_job()``).

The worker sets it around each task call; outside a worker it is ``None``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from .engine import ClaimedJob


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job being run: the claimed job (id, queue, attempt...) and the worker's name."""

    job: ClaimedJob
    worker: str


_current: ContextVar[RunningJob | None] = ContextVar("delayq_current_job", default=None)


def current_job() -> RunningJob | None:
    """The job this thread is running on a worker, or ``None``."""
    return _current.get()


@contextmanager
def running(job: ClaimedJob, worker: str) -> Iterator[RunningJob]:
    """Mark ``job`` as the current job of this thread for the duration of the block."""
    value = RunningJob(job, worker)
    token = _current.set(value)
    try:
        yield value
    finally:
        _current.reset(token)
