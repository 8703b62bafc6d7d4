"""Code that runs around each job a worker runs, besides the task: one small interface.

A :class:`Middleware` is told before and after each job, on the thread that runs it (or
on the event loop, for an ``async def`` task). The runtime knows no framework: the
Django layer checks its database connections through one (``close_old_connections``, as
Django does around a request), and signals, traces or metrics plug in the same way.
"""

from __future__ import annotations

from ...engine import ClaimedJob
from .outcome import Outcome

#: A thread idle longer than this is said to be idle before its next job (a middleware
#: checking connections then checks them before it too: CONN_MAX_AGE may have passed).
IDLE = 1.0


class Middleware:
    """Hooks around each job; every method is a no-op here. What a hook raises before a
    job fails that job (retried); what it raises after one is logged."""

    def before_job(self, job: ClaimedJob, *, idle: bool) -> None:
        """Before ``job`` runs on this thread; ``idle``: the thread did nothing for more
        than :data:`IDLE` seconds before it."""

    def after_job(self, job: ClaimedJob, outcome: Outcome) -> None:
        """After ``job`` ran on this thread, with what happened."""

    async def before_async_job(self, job: ClaimedJob, *, idle: bool) -> None:
        """Before an ``async def`` job, on the event loop (never block it)."""

    async def after_async_job(self, job: ClaimedJob, outcome: Outcome) -> None:
        """After an ``async def`` job, on the event loop."""

    def thread_ended(self) -> None:
        """On an executor thread that runs no more jobs (the worker stops, or the
        thread failed): let go of what the hooks kept on it."""
