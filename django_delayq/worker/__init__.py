"""The worker as a Django project runs it: the runtime's worker
(:mod:`django_delayq.runtime.worker`) with the project's settings, its registered tasks
and Django's database connections checked around each job.

:class:`Worker` takes the options of ``runworker`` (each defaults to its
``DELAYQ`` setting); :func:`worker_options` builds the runtime's :class:`WorkerOptions`
the same way for the processes a host starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..conf import conf
from ..connection import get_broker
from ..engine import Broker
from ..runtime.deadlines import Board
from ..runtime.registry import TaskRegistry, registry
from ..runtime.worker import runner
from ..runtime.worker.exit_codes import EXIT_FORCED, EXIT_OK, EXIT_RESTART
from ..runtime.worker.outcome import CorruptPayload, Outcome
from ..runtime.worker.runner import WorkerOptions
from ..runtime.worker.timelimits import HARD_LIMIT_GRACE
from .connections import DatabaseConnections
from .hooks import JobSignals, job_middleware

__all__ = ["EXIT_FORCED", "EXIT_OK", "EXIT_RESTART", "CorruptPayload", "Outcome", "Worker",
           "WorkerOptions", "worker_options"]


def worker_options(*, concurrency: int | None = None, burst: bool = False,
                   lease: float | None = None, grace_period: float | None = None,
                   block_timeout: float | None = None, prefetch: int | None = None,
                   timeout: float | None = None, timeout_grace: float = HARD_LIMIT_GRACE,
                   async_concurrency: int | None = None) -> WorkerOptions:
    """The options given, each one left out (None) read from its ``DELAYQ`` setting."""
    return WorkerOptions(
        concurrency=concurrency or conf.CONCURRENCY,
        async_concurrency=async_concurrency or conf.ASYNC_CONCURRENCY,
        lease=lease or conf.LEASE,
        grace_period=conf.GRACE_PERIOD if grace_period is None else grace_period,
        block_timeout=block_timeout or conf.BLOCK_TIMEOUT,
        prefetch=prefetch, timeout=conf.TIMEOUT if timeout is None else timeout,
        timeout_grace=timeout_grace, burst=burst)


class Worker(runner.Worker):
    """Runs jobs of ``queues`` (default: every queue with registered tasks) with the
    project's settings; the keyword options are ``runworker``'s."""

    def __init__(self, queues: Sequence[str] | None = None, *,
                 broker: Broker | None = None, blocking_broker: Broker | None = None,
                 tasks: TaskRegistry | None = None, name: str | None = None,
                 board: Board | None = None, **options: Any) -> None:
        tasks = tasks or registry
        settings = worker_options(**options)
        if broker is None:
            broker = get_broker()
            blocking_broker = blocking_broker or get_broker(
                socket_timeout=settings.block_timeout + conf.SOCKET_TIMEOUT)
        around = job_middleware()
        super().__init__(list(queues or tasks.queues() or [conf.DEFAULT_QUEUE]),
                         options=settings, broker=broker,
                         blocking_broker=blocking_broker or broker, tasks=tasks, name=name,
                         middleware=[DatabaseConnections(), *around], board=board)
        for each in around:  # the name is chosen above when none is given
            if isinstance(each, JobSignals):
                each.worker = self.name
