"""The middleware of a Django worker besides its database connections: the signals of
:mod:`django_delayq.signals` and, with the ``otel`` extra, a trace span per attempt."""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

from .. import signals
from ..engine import ClaimedJob
from ..engine.logfields import log
from ..runtime import tracing
from ..runtime.worker.middleware import Middleware
from ..runtime.worker.outcome import Outcome

logger = logging.getLogger("django_delayq.worker")


def _after(outcome: Outcome) -> Signal:
    if outcome.ok:
        return signals.job_finished
    return signals.job_failed if outcome.final else signals.job_retried


def _send(signal: Signal, job: ClaimedJob, worker: str, **more: Any) -> None:
    for receiver, response in signal.send_robust(job.task, job=job, worker=worker, **more):
        if isinstance(response, Exception):
            log(logger, logging.ERROR, "signal receiver failed", exc_info=response,
                receiver=repr(receiver), job=job.id, queue=job.queue, task=job.task)


async def _asend(signal: Signal, job: ClaimedJob, worker: str, **more: Any) -> None:
    for receiver, response in await signal.asend_robust(job.task, job=job, worker=worker,
                                                         **more):
        if isinstance(response, Exception):
            log(logger, logging.ERROR, "signal receiver failed", exc_info=response,
                receiver=repr(receiver), job=job.id, queue=job.queue, task=job.task)



class JobSignals(Middleware):
    """Sends ``job_started`` before each job, and its outcome's signal after it."""

    def __init__(self, worker: str = "") -> None:
        self.worker = worker

    def before_job(self, job: ClaimedJob, *, idle: bool) -> None:
        if signals.job_started.receivers:
            _send(signals.job_started, job, self.worker)

    def after_job(self, job: ClaimedJob, outcome: Outcome) -> None:
        signal = _after(outcome)
        if signal.receivers:
            _send(signal, job, self.worker, outcome=outcome, exception=outcome.exception)

    async def before_async_job(self, job: ClaimedJob, *, idle: bool) -> None:
        if signals.job_started.receivers:
            await _asend(signals.job_started, job, self.worker)

    async def after_async_job(self, job: ClaimedJob, outcome: Outcome) -> None:
        signal = _after(outcome)
        if signal.receivers:
            await _asend(signal, job, self.worker, outcome=outcome,
                         exception=outcome.exception)


def job_middleware(worker: str = "") -> list[Middleware]:
    """The middleware every Django worker runs around its jobs, after its connections'."""
    return [JobSignals(worker), *tracing.middleware()]
