"""Jobs as Django's Tasks API describes them: result ids, statuses, ``TaskResult``s of
jobs read from Redis and of the job a worker thread runs, and their errors."""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import datetime as dt
import json
import traceback
from typing import Any

from django.utils import timezone

from ..conf import django_time
from ..engine import DelayQError
from ..engine import Job as EngineJob
from ..engine import errors as engine_errors
from ..engine.keys import QUEUE_NAME_RE
from ..engine.status import OUTBOX, Status
from ..runtime.current import RunningJob
from .framework import InvalidTask, Task, TaskError, TaskResult, TaskResultStatus, task_finished

#: How delayq statuses show in Django's Tasks API.
STATUS_MAP: dict[str, TaskResultStatus] = {
    OUTBOX: TaskResultStatus.READY,  # written in a transaction, not yet in Redis
    Status.WAITING: TaskResultStatus.READY,  # waits for its parents (depends_on)
    Status.SCHEDULED: TaskResultStatus.READY,
    Status.READY: TaskResultStatus.READY,
    Status.CLAIMED: TaskResultStatus.READY,  # leased by a worker, waiting for a thread
    Status.ACTIVE: TaskResultStatus.RUNNING,
    Status.COMPLETED: TaskResultStatus.SUCCESSFUL,
    Status.FAILED: TaskResultStatus.FAILED,
    Status.CANCELLED: TaskResultStatus.FAILED,
}


class JobCancelled(DelayQError):
    """The error a cancelled job reports through the Tasks API (it never ran to the end)."""



# The class's public path: django_delayq.backends exports it (docs/django-tasks.md).
_CANCELLED_PATH = "django_delayq.backends.JobCancelled"


def make_result_id(queue: str, job_id: str) -> str:
    """The Tasks API id of a job: ``<queue>:<job id>`` (queue names never hold ``:``)."""
    return f"{queue}:{job_id}"


def parse_result_id(result_id: str) -> tuple[str | None, str]:
    """``(queue, job id)`` of a result id; the queue is ``None`` for a bare job id."""
    queue, sep, job_id = str(result_id).partition(":")
    if sep and QUEUE_NAME_RE.match(queue):
        return queue, job_id
    return None, str(result_id)


def build_result(task: Task, job: EngineJob, result_id: str, alias: str) -> TaskResult:
    """A ``TaskResult`` describing ``job`` (a job of ``task``) as last read."""
    run_after = django_time(job.run_at) if job.run_at and job.enqueued_at and (
        job.run_at > job.enqueued_at) else None
    with contextlib.suppress(InvalidTask):
        task = dataclasses.replace(task, priority=job.priority, queue_name=job.queue,
                                   run_after=run_after, backend=alias)
    errors = []
    if job.error:
        errors.append(TaskError(exception_class_path=_error_class_path(job.error),
                                traceback=job.traceback or job.error))
    if job.status == Status.CANCELLED:  # before it ran, or after a run (an abort, a retry)
        when = f"after {job.attempts} attempt(s)" if job.attempts else "before it ran"
        errors.append(TaskError(exception_class_path=_CANCELLED_PATH,
                                traceback=f"The job was cancelled {when}.\n"))
    status = STATUS_MAP.get(job.status, TaskResultStatus.READY)
    if status == TaskResultStatus.FAILED and not errors:  # damaged: its error was lost
        errors.append(TaskError(exception_class_path="builtins.Exception",
                                traceback="No error was recorded for this job.\n"))
    result = TaskResult(
        task=task, id=result_id, status=status, enqueued_at=django_time(job.enqueued_at),
        started_at=django_time(job.started_at),
        finished_at=django_time(job.finished_at) if job.is_finished else None,
        last_attempted_at=django_time(job.started_at),
        args=list(job.args) if isinstance(job.args, list) else [],
        kwargs=dict(job.kwargs) if isinstance(job.kwargs, dict) else {},
        backend=alias, errors=errors,
        worker_ids=_worker_ids(job),
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", job.result)
    return result


def _error_class_path(error: str) -> str:
    """The exception class path of a job's error line (``module.Class: message``).

    delayq's own reasons (``LeaseExpired``, ``DamagedJob``, ``DependencyFailed``), which
    the scripts record by bare name, become the path of their class in
    :mod:`django_delayq.engine.errors`, so that ``TaskError.exception_class`` finds it.
    """
    path = error.split(":", 1)[0].strip()
    if "." not in path:
        known = getattr(engine_errors, path, None)
        if isinstance(known, type) and issubclass(known, engine_errors.DelayQError):
            return f"{known.__module__}.{known.__qualname__}"
        builtin = getattr(builtins, path, None)  # a refusal the outbox kept: TypeError
        if isinstance(builtin, type) and issubclass(builtin, BaseException):
            return f"builtins.{path}"
    return path


def _worker_ids(job: EngineJob) -> list[str]:
    """The worker of each attempt, oldest first: the attempt log, plus the running one."""
    ids = [entry["worker"] for entry in job.attempt_log]
    logged = {entry["attempt"] for entry in job.attempt_log}
    if job.status == Status.ACTIVE and job.worker and job.attempts not in logged:
        ids.append(job.worker)
    return ids


def running_result(task: Task, running: RunningJob | None, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> TaskResult:
    """The RUNNING ``TaskResult`` of the job this worker thread is running."""
    now = timezone.now()
    if running is None:  # called outside a worker: no job to describe
        return TaskResult(
            task=task, id="", status=TaskResultStatus.RUNNING, enqueued_at=None, started_at=now,
            finished_at=None, last_attempted_at=now, args=list(args), kwargs=dict(kwargs),
            backend=task.backend, errors=[], worker_ids=[],
        )
    job = running.job
    with contextlib.suppress(InvalidTask):
        task = task.using(priority=job.priority, queue_name=job.queue)
    started = django_time(dt.datetime.fromtimestamp(job.started_at_ms / 1000, tz=dt.UTC))
    return TaskResult(
        task=task, id=make_result_id(job.queue, job.id), status=TaskResultStatus.RUNNING,
        enqueued_at=django_time(dt.datetime.fromtimestamp(job.enqueued_at_ms / 1000, tz=dt.UTC)),
        started_at=started, finished_at=None, last_attempted_at=started, args=list(args),
        kwargs=dict(kwargs), backend=task.backend, errors=[],
        worker_ids=[running.worker] * max(1, job.attempt),
    )


def send_finished(sender: type, result: TaskResult, outcome: Any, *,
                   raised: list[BaseException] | None = None) -> None:
    """Send ``task_finished`` for a job's final ``outcome`` (a worker ``Outcome``):
    SUCCESSFUL, FAILED when no retry follows, else READY (it will run again).

    ``raised`` holds what the task raised, if it did: the signal is then sent while that
    exception is being handled, as Django's own backends send it, so that receivers
    reading ``sys.exc_info()`` (Django's log line of a failed task) see it.
    """
    error = raised.pop() if raised else None
    if outcome.ok:
        finish(result, json.loads(outcome.result_json))
    else:
        result.errors.append(TaskError(exception_class_path=_error_class_path(outcome.error),
                                       traceback=outcome.traceback or outcome.error))
        finish(result, status=TaskResultStatus.FAILED if outcome.final
               else TaskResultStatus.READY)
    if error is None or outcome.ok:
        task_finished.send(sender, task_result=result)
        return
    try:
        raise error
    except BaseException:
        task_finished.send(sender, task_result=result)


def finish(result: TaskResult, value: Any = None,
           status: TaskResultStatus = TaskResultStatus.SUCCESSFUL) -> None:
    """Mark ``result`` finished now with ``status``; SUCCESSFUL, it returned ``value``."""
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", value)


def fail(result: TaskResult, exc: Exception) -> None:
    """Mark ``result`` failed by ``exc``: a task called outside a worker has no retry."""
    result.errors.append(TaskError(
        exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
        traceback="".join(traceback.format_exception(exc))))
    finish(result, status=TaskResultStatus.FAILED)

