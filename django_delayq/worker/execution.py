"""Running one job: resolve its task in the registry, decode, call, encode the result.

Everything that can go wrong with a job ends in an :class:`Outcome`, never in an
exception that would stop the thread running it.
"""

from __future__ import annotations

import json
import logging
import time
import traceback
from dataclasses import dataclass

from django.db import close_old_connections

from ..current import running
from ..engine import ClaimedJob, UnknownTask, encode_result
from ..task import TaskRegistry

logger = logging.getLogger("django_delayq.worker")


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


def execute(job: ClaimedJob, tasks: TaskRegistry, encoder: type[json.JSONEncoder],
            worker: str, *, check_connections: bool = True) -> Outcome:
    """Run ``job`` with Django's ``close_old_connections()`` around it, as Django does
    around a request.

    ``check_connections=False`` skips the call before the job: for a thread whose
    previous job has just made the call after itself, nothing has happened since.
    An unknown task and an exception of the task are retried (while attempts remain);
    undecodable data and a return value that is not JSON are not.
    """
    started = time.perf_counter()
    if check_connections:
        close_old_connections()
    try:
        if not job.task:
            return failure(job, CorruptPayload("the job has no task name"), retry=False)
        try:
            task = tasks.get(job.task)
        except UnknownTask as exc:
            return failure(job, exc, retry=True)
        try:
            args = json.loads(job.args_json)
            kwargs = {} if job.kwargs_json == "{}" else json.loads(job.kwargs_json)
            if not isinstance(args, list) or not isinstance(kwargs, dict):
                raise ValueError("args must be a JSON array and kwargs a JSON object")
        except (ValueError, RecursionError) as exc:
            return failure(job, CorruptPayload(f"undecodable arguments: {exc}"), retry=False)
        try:
            with running(job, worker):
                value = task.func(*args, **kwargs)
        except Exception as exc:
            return failure(job, exc, retry=True, delay=task.retry_delay(job.attempt))
        try:
            result_json = encode_result(value, encoder)
        except TypeError as exc:
            return failure(job, exc, retry=False)
    finally:
        close_old_connections()
    # DEBUG, not INFO: a line per job costs more than a no-op job itself (-v 2 shows it).
    logger.debug("job completed job=%s queue=%s task=%s attempt=%d duration_ms=%.1f",
                job.id, job.queue, job.task, job.attempt,
                (time.perf_counter() - started) * 1000)
    return Outcome(job, True, result_json=result_json)


def failure(job: ClaimedJob, exc: BaseException, *, retry: bool, delay: float = 1.0) -> Outcome:
    """The failed :class:`Outcome` of ``job``, logged with its error and traceback."""
    error = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    tb = "".join(traceback.format_exception(exc))
    will_retry = retry and job.attempt < job.max_attempts
    logger.log(
        logging.WARNING if will_retry else logging.ERROR,
        "job %s job=%s queue=%s task=%s attempt=%d/%d error=%s",
        "failed, will retry" if will_retry else "failed", job.id, job.queue, job.task,
        job.attempt, job.max_attempts, error,
        exc_info=not will_retry and not isinstance(exc, UnknownTask | CorruptPayload),
    )
    return Outcome(job, False, error=error[:2000], traceback=tb[-20000:],
                   retry_delay_ms=int(delay * 1000) if retry else -1)
