"""Running one job: resolve its task in the registry, decode, call, encode the result.

Everything that can go wrong with a job ends in an :class:`Outcome`, never in an
exception that would stop the thread running it: whatever the task raises
(``BaseException`` included: ``SystemExit``, ``KeyboardInterrupt``, a library's own
subclass, an exception whose ``__str__`` raises) fails the job with its class, a
message and the traceback, retried or dead-lettered by the usual rules.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections

from ..current import running
from ..engine import ClaimedJob, UnknownTask, encode_result
from ..task import TaskRegistry
from .ledger import Ledger

logger = logging.getLogger("django_delayq.worker")

#: Longest error line and traceback kept with a job.
MAX_ERROR = 2000
MAX_TRACEBACK = 20000

#: A thread idle longer than this checks Django's connections (close_old_connections)
#: before its next job too, not only after each job (CONN_MAX_AGE may have passed).
IDLE_CONNECTION_CHECK = 1.0


class CorruptPayload(ValueError):
    """A job's stored data (task name or arguments) could not be decoded."""


@dataclass(slots=True)
class Outcome:
    """What happened to one job, waiting to be acked."""

    job: ClaimedJob
    ok: bool
    result_json: str = ""
    error: str = ""
    traceback: str = ""
    retry_delay_ms: int = -1
    #: Start and end of the run (Redis clock, estimated; 0 when unknown).
    started_ms: int = 0
    finished_ms: int = 0

    @property
    def final(self) -> bool:
        """Whether the job is over: completed, or failed with no retry to come."""
        return self.ok or self.retry_delay_ms < 0 or self.job.attempt >= self.job.max_attempts


def execute(job: ClaimedJob, tasks: TaskRegistry, worker: str, *, check_connections: bool = True,
            on_finished: list[Callable[[Outcome], None]] | None = None) -> Outcome:
    """Run ``job`` with Django's ``close_old_connections()`` around it, as Django does
    around a request. What the task adds to its ``on_finished`` hooks goes to
    ``on_finished``: the caller calls them (:func:`finished`) once the outcome is final.

    ``check_connections=False`` skips the call before the job: for a thread whose
    previous job has just made the call after itself, nothing has happened since.
    An unknown task and an exception of the task are retried (while attempts remain);
    undecodable data and a return value that is not JSON are not.
    """
    try:
        if check_connections:
            close_old_connections()
        return _run(job, tasks, worker, [] if on_finished is None else on_finished)
    finally:
        close_old_connections()


def _run(job: ClaimedJob, tasks: TaskRegistry, worker: str,
         on_finished: list[Callable[[Outcome], None]]) -> Outcome:
    if not job.task:
        return failure(job, CorruptPayload("the job has no task name"), retry=False)
    try:
        task = tasks.get(job.task)
    except UnknownTask as exc:
        return failure(job, exc, retry=True)
    try:
        args, kwargs = decode_arguments(job)
    except CorruptPayload as exc:
        return failure(job, exc, retry=False)
    with running(job, worker, on_finished):
        try:
            value = task.func(*args, **kwargs)
        except BaseException as exc:  # every failure of a task is the job's
            return failure(job, exc, retry=True, delay=task.retry_delay(job.attempt))
    try:
        result_json = encode_result(value)
    except BaseException as exc:  # a value whose encoding raises anything
        return failure(job, exc, retry=False)
    return Outcome(job, True, result_json=result_json)


def finished(hooks: list[Callable[[Outcome], None]], outcome: Outcome) -> None:
    """Call (and forget) a job's ``on_finished`` hooks with its final ``outcome``, once.

    A hook that raises, ``BaseException`` included (a ``task_finished`` receiver calling
    ``sys.exit()``), is logged and the next one called: the outcome is the job's, and the
    worker goes on.
    """
    while hooks:
        hook = hooks.pop(0)
        try:
            hook(outcome)
        except BaseException:
            logger.exception("on_finished hook failed job=%s", outcome.job.id)


def after_job(hook: Callable[[], None] | None, job: ClaimedJob) -> None:
    """Call a worker's after-job hook (recycling counts jobs with it); what it raises is
    logged, so the job's outcome is reported all the same."""
    if hook is None:
        return
    try:
        hook()
    except BaseException:
        logger.exception("after-job hook failed job=%s", job.id)


def fail_held(ledger: Ledger, report: Callable[[Outcome], None], job: ClaimedJob,
              exc: BaseException) -> bool:
    """Fail ``job`` (retried while attempts remain) when what runs it raised outside the
    task (a fault of the worker, not of the job) while its lease was still buffered or
    running: held with no outcome, it would be renewed for ever and its slot lost.
    Returns whether the job was still held so."""
    lease = ledger.abandon(job, buffered=True)
    if lease is None:
        return False
    logger.error("job run failed outside its task, failing it job=%s queue=%s task=%s "
                 "error=%s", job.id, job.queue, job.task, describe(exc))
    outcome = failure(job, exc, retry=True)
    if lease.began:
        outcome.started_ms = lease.started_ms
        outcome.finished_ms = lease.started_ms + int((time.monotonic() - lease.began) * 1000)
    report(outcome)
    finished(lease.on_finished, outcome)  # hooks its task added, if it got that far
    return True


def describe(exc: BaseException) -> str:
    """One line: the exception's class and message, even when its ``__str__`` raises."""
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    try:
        message = str(exc)
    except BaseException as str_error:
        try:
            message = f"<unprintable: __str__ raised {type(str_error).__qualname__}>; " \
                      f"args={exc.args!r}"
        except BaseException:  # an argument's __repr__ raises too
            message = f"<unprintable: __str__ raised {type(str_error).__qualname__}>"
    return f"{name}: {message}" if message else name


def format_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` as text, even when formatting it raises."""
    try:
        return "".join(traceback.format_exception(exc))
    except BaseException:
        return "Traceback (most recent call last):\n" + "".join(
            traceback.format_tb(exc.__traceback__)) + describe(exc) + "\n"


def decode_arguments(job: ClaimedJob) -> tuple[list[Any], dict[str, Any]]:
    """``job``'s positional and keyword arguments; :class:`CorruptPayload` if they do
    not decode to a JSON array and a JSON object."""
    try:
        args = json.loads(job.args_json)
        kwargs = {} if job.kwargs_json == "{}" else json.loads(job.kwargs_json)
    except (ValueError, RecursionError) as exc:
        raise CorruptPayload(f"undecodable arguments: {exc}") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise CorruptPayload("undecodable arguments: args must be a JSON array and kwargs "
                             "a JSON object")
    return args, kwargs


def failure(job: ClaimedJob, exc: BaseException, *, retry: bool, delay: float = 1.0) -> Outcome:
    """The failed :class:`Outcome` of ``job``, logged with its error and traceback."""
    error = describe(exc)
    tb = format_traceback(exc)
    outcome = Outcome(job, False, error=error[:MAX_ERROR], traceback=tb[-MAX_TRACEBACK:],
                      retry_delay_ms=int(delay * 1000) if retry else -1)
    # The job's line (its fate and error) is logged once its ack lands; the traceback,
    # kept with the job, shows here at -v 2.
    logger.debug("job attempt failed job=%s queue=%s task=%s attempt=%d/%d error=%s\n%s",
                 job.id, job.queue, job.task, job.attempt, job.max_attempts, error, tb)
    return outcome
