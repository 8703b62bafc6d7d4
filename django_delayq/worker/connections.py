"""Django's database connections around each job, as Django checks them around a request.

``close_old_connections()`` after every job, and before one when the thread idled (its
connections may have outlived ``CONN_MAX_AGE`` or broken meanwhile), on a thread that
has opened a connection since the check before (no other can hold one). An ``async def``
job's database work runs on the thread ``sync_to_async`` uses, so the check runs there,
and only when that thread may hold a connection: one was opened in the process since its
last check, or that check left one open. A job that touches no database costs no trip
to that thread.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.db import close_old_connections, connections
from django.db.backends.signals import connection_created

from ..engine import ClaimedJob
from ..runtime.worker.middleware import IDLE, Middleware
from ..runtime.worker.outcome import Outcome


def _check_connections() -> bool:
    """``close_old_connections()`` on this thread; whether a connection is still open."""
    close_old_connections()
    return any(c.connection is not None for c in connections.all(initialized_only=True))


class DatabaseConnections(Middleware):
    """Checks Django's connections around each job."""

    def __init__(self) -> None:
        #: Whether sync_to_async's thread may hold a connection (async jobs only).
        self._dirty = True
        self._checked = float("-inf")
        #: ``opened``: whether this executor thread may hold a connection.
        self._thread = threading.local()
        connection_created.connect(self._opened, dispatch_uid=f"delayq-{id(self)}",
                                   weak=True)

    def _opened(self, **kwargs: Any) -> None:  # sent on the thread that connects
        self._dirty = True
        self._thread.opened = True

    def _check_thread(self) -> None:
        if getattr(self._thread, "opened", True):  # unknown until its first check
            self._thread.opened = _check_connections()

    def before_job(self, job: ClaimedJob, *, idle: bool) -> None:
        if idle:  # checked as the previous job ended: only age can have hurt them since
            self._check_thread()

    def after_job(self, job: ClaimedJob, outcome: Outcome) -> None:
        self._check_thread()

    def thread_ended(self) -> None:
        # Kept connections (CONN_MAX_AGE) would stay open until the garbage collector
        # finds them, and hold a server's connection slot until then.
        connections.close_all()

    async def before_async_job(self, job: ClaimedJob, *, idle: bool) -> None:
        if self._dirty and time.monotonic() - self._checked > IDLE:
            await self._check()

    async def after_async_job(self, job: ClaimedJob, outcome: Outcome) -> None:
        if self._dirty:
            await self._check()

    async def _check(self) -> None:
        self._dirty = False  # a connection opened during the check sets it again
        self._checked = time.monotonic()
        if await sync_to_async(_check_connections)():
            self._dirty = True
