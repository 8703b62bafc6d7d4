"""What happened to a job: its :class:`Outcome`, and the failures every path words the
same way (:func:`failure`: the exception's class, a message that never raises, the
traceback), whatever the task raised."""

from __future__ import annotations

import json
import logging
import traceback
from dataclasses import dataclass
from typing import Any

from ...engine import ClaimedJob
from ...engine.logfields import log

logger = logging.getLogger("django_delayq.worker")

#: Longest error line of an outcome (and its log line); what Redis keeps of it and of the
#: traceback, ERROR_MAX_BYTES, is cut by the engine.
MAX_ERROR = 2000


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
    #: What the task raised (signals and traces report it; never sent to Redis).
    exception: BaseException | None = None
    #: Start and end of the run (Redis clock, estimated; 0 when unknown).
    started_ms: int = 0
    finished_ms: int = 0

    @property
    def final(self) -> bool:
        """Whether the job is over: completed, or failed with no retry to come."""
        return self.ok or self.retry_delay_ms < 0 or self.job.attempt >= self.job.max_attempts


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


def sendable(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate (a file name decoded with
    ``surrogateescape``, as ``os.listdir`` gives one) written as its escape (``\\udcff``),
    where it would make every round trip carrying it fail."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def decode_arguments(job: ClaimedJob) -> tuple[list[Any], dict[str, Any]]:
    """``job``'s positional and keyword arguments; :class:`CorruptPayload` if they do
    not decode to a JSON array and a JSON object."""
    try:
        args = [] if job.args_json == "[]" else json.loads(job.args_json)
        kwargs = {} if job.kwargs_json == "{}" else json.loads(job.kwargs_json)
    except (ValueError, RecursionError) as exc:
        raise CorruptPayload(f"undecodable arguments: {exc}") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise CorruptPayload("undecodable arguments: args must be a JSON array and kwargs "
                             "a JSON object")
    return args, kwargs


def failure(job: ClaimedJob, exc: BaseException, *, retry: bool, delay: float = 1.0) -> Outcome:
    """The failed :class:`Outcome` of ``job``, logged with its error and traceback."""
    error = sendable(describe(exc))
    tb = sendable(format_traceback(exc))
    outcome = Outcome(job, False, error=error[:MAX_ERROR], traceback=tb,
                      retry_delay_ms=int(delay * 1000) if retry else -1, exception=exc)
    # The job's record (its fate and error) is logged once its ack lands; the traceback,
    # kept with the job, shows here at -v 2.
    log(logger, logging.DEBUG, "job attempt failed", exc_info=exc, job=job.id,
        queue=job.queue, task=job.task, attempt=job.attempt, max_attempts=job.max_attempts,
        error=error)
    return outcome
