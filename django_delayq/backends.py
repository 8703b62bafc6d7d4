"""A backend for Django's Tasks framework that runs tasks on django-delayq.

``django.tasks`` on Django 6, the ``django-tasks`` package on Django 5.2::

    TASKS = {
        "default": {
            "BACKEND": "django_delayq.backends.DelayQBackend",
            "QUEUES": ["default", "emails"],          # [] accepts any queue name
            "OPTIONS": {"MAX_ATTEMPTS": 1, "OUTBOX": False},
        }
    }

``"OUTBOX": True`` makes ``enqueue()`` write the job into the transactional outbox
(:meth:`django_delayq.task.Task.enqueue_in_transaction`): it exists if and only if the
current database transaction commits, and reaches Redis right after the commit (or
through the relay when Redis was unreachable). ``get_result`` answers READY for a job
still in the outbox.

Code written against the standard API (``@task(priority=..., queue_name=...)``,
``.using(run_after=...)``, ``.enqueue()``, ``get_result()``) then runs on delayq workers.
The worker resolves task names only through :data:`django_delayq.task.registry`, so
``validate_task`` (which Django calls when a task is declared, and again on ``using()``
and ``enqueue()``) registers a delayq task under the Django task's ``module_path``.
A worker that autodiscovers ``<app>.tasks`` therefore knows every Django task declared
there. Result ids are ``<queue>:<job id>``. The backend opens no connection until a
task is enqueued or a result is read.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import inspect
import json
import logging
import threading
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

from .engine import DelayQError, JobNotFound
from .engine import Job as EngineJob
from .engine import errors as engine_errors
from .engine.keys import QUEUE_NAME_RE
from .engine.status import OUTBOX, Status
from .task import Task as DelayQTask
from .task import registry

try:  # Django 6+
    from django.tasks import TaskContext, TaskResult, TaskResultStatus
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import Task, TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
except ImportError:
    try:  # the django-tasks backport on Django 5.2
        from django_tasks import TaskContext, TaskResult, TaskResultStatus
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json

        try:
            from django_tasks.exceptions import InvalidTask  # type: ignore[attr-defined,unused-ignore]
        except ImportError:  # django-tasks < 0.13 names it InvalidTaskError
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
    except ImportError as exc:
        raise ImportError(
            "django_delayq.backends needs Django's Tasks framework: use Django 6, or on "
            "Django 5.2 pip install 'django-delayq[tasks]' (the django-tasks package)"
        ) from exc

from .runtime.current import RunningJob, current_job

__all__ = ["DelayQBackend", "JobCancelled", "make_result_id", "parse_result_id"]

logger = logging.getLogger("django_delayq.backends")

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

OPTIONS = {"MAX_ATTEMPTS", "OUTBOX"}


class JobCancelled(DelayQError):
    """The error a cancelled job reports through the Tasks API (it never ran to the end)."""


_CANCELLED_PATH = f"{JobCancelled.__module__}.{JobCancelled.__qualname__}"

_lock = threading.Lock()
#: module_path -> (the Django task first declared under it, its registered delayq task)
_known: dict[str, tuple[Task, DelayQTask[Any, Any]]] = {}


def make_result_id(queue: str, job_id: str) -> str:
    """The Tasks API id of a job: ``<queue>:<job id>`` (queue names never hold ``:``)."""
    return f"{queue}:{job_id}"


def parse_result_id(result_id: str) -> tuple[str | None, str]:
    """``(queue, job id)`` of a result id; the queue is ``None`` for a bare job id."""
    queue, sep, job_id = str(result_id).partition(":")
    if sep and QUEUE_NAME_RE.match(queue):
        return queue, job_id
    return None, str(result_id)


class DelayQBackend(BaseTaskBackend):
    """Django Tasks backend storing jobs in django-delayq's Redis queues."""

    supports_defer = True
    supports_priority = True
    supports_get_result = True
    supports_async_task = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        attempts = self.options.get("MAX_ATTEMPTS", 1)
        valid = isinstance(attempts, int) and not isinstance(attempts, bool) and attempts >= 1
        self.max_attempts: int = attempts if valid else 1  # else: check E041 reports it
        self.outbox: bool = self.options.get("OUTBOX", False) is True

    # -- declaring ----------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        """Django's checks, delayq's (queue name), then register the task for workers."""
        super().validate_task(task)
        if not QUEUE_NAME_RE.match(task.queue_name):
            raise InvalidTask(f"queue name {task.queue_name!r} is not valid for django-delayq: "
                              "use 1-64 characters from A-Z a-z 0-9 _ . -")
        self._register(task)

    def _register(self, task: Task) -> DelayQTask[Any, Any]:
        name = task.module_path
        with _lock:
            known = _known.get(name)
            if known is not None and known[0].func is task.func and name in registry:
                return known[1]
            try:
                dq_task: DelayQTask[Any, Any] = DelayQTask(
                    func=_runner(task), name=name, queue=task.queue_name,
                    priority=task.priority, max_attempts=self.max_attempts,
                )
                registry.register(dq_task)
            except (TypeError, ValueError, DelayQError, ImproperlyConfigured) as exc:
                raise InvalidTask(f"{name}: {exc}") from exc
            _known[name] = (task, dq_task)
            return dq_task

    # -- enqueuing ----------------------------------------------------------------

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """Send a job to delayq; ``run_after`` defers it, ``priority`` orders it.

        Raises ``TypeError`` for arguments the function does not take or that are not
        JSON, and :class:`~django_delayq.DelayQConnectionError` if Redis is unreachable.
        """
        self.validate_task(task)
        args, kwargs = _normalized_arguments(task, args, kwargs)
        dq_task = self._register(task)
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):  # only when USE_TZ is off
            run_at = timezone.make_aware(run_at)
        configured = dq_task.using(queue=task.queue_name, priority=task.priority,
                                   run_at=run_at, max_attempts=self.max_attempts)
        if self.outbox:
            job: EngineJob = configured.enqueue_in_transaction(*args, **kwargs)
        else:
            job = configured.enqueue(*args, **kwargs)
        result = TaskResult(
            task=task, id=make_result_id(job.queue, job.id), status=TaskResultStatus.READY,
            enqueued_at=job.enqueued_at, started_at=None, finished_at=None,
            last_attempted_at=None, args=list(args), kwargs=dict(kwargs), backend=self.alias,
            errors=[], worker_ids=[],
        )
        logger.debug("enqueued job=%s queue=%s task=%s", job.id, job.queue, task.module_path)
        task_enqueued.send(type(self), task_result=result)
        return result

    # -- results ------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as Redis holds it now.

        Raises ``TaskResultDoesNotExist`` for an unknown (or expired) id, and for a job
        that is not a Django task.
        """
        queue, job_id = parse_result_id(result_id)
        queues = [queue] if queue else sorted(self.queues)
        for name in queues:
            try:
                job = EngineJob.fetch(job_id, name)
            except (JobNotFound, ValueError):
                continue
            return self._result(job, make_result_id(name, job_id))
        waiting = _waiting_in_outbox(job_id, queues) if self.outbox else None
        if waiting is not None:
            return self._result(waiting, make_result_id(waiting.queue, job_id))
        raise TaskResultDoesNotExist(result_id)

    def _result(self, job: EngineJob, result_id: str) -> TaskResult:
        task = _django_task(job.task_name)
        if task is None:
            raise TaskResultDoesNotExist(
                f"{result_id}: job runs {job.task_name!r}, which is not a Django task"
            )
        return build_result(task, job, result_id, self.alias)

    def check(self, **kwargs: Any) -> Iterable[checks.CheckMessage]:
        errors: list[checks.CheckMessage] = []
        unknown = sorted(set(self.options) - OPTIONS)
        attempts = self.options.get("MAX_ATTEMPTS", 1)
        bad_queues = sorted(q for q in self.queues
                            if not isinstance(q, str) or not QUEUE_NAME_RE.match(q))
        if unknown:
            errors.append(checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS'] has unknown keys: {', '.join(unknown)}.",
                hint=f"Known options: {', '.join(sorted(OPTIONS))}.", id="django_delayq.E041"))
        if not isinstance(self.options.get("OUTBOX", False), bool):
            errors.append(checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS']['OUTBOX'] must be True or False, not "
                f"{self.options['OUTBOX']!r}.", id="django_delayq.E041"))
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
            errors.append(checks.Error(
                f"TASKS[{self.alias!r}]['OPTIONS']['MAX_ATTEMPTS'] must be an int >= 1, "
                f"not {attempts!r}.", id="django_delayq.E041"))
        if bad_queues:
            errors.append(checks.Error(
                f"TASKS[{self.alias!r}]['QUEUES'] has invalid queue names: {bad_queues!r}.",
                hint="Use 1-64 characters from A-Z a-z 0-9 _ . -", id="django_delayq.E041"))
        return errors


def _normalized_arguments(task: Task, args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """``args`` and ``kwargs`` as Django's ``TaskResult`` keeps them (its ``normalize_json``:
    tuples become lists, bytes text), checked before anything is written.

    Raises what ``normalize_json`` raises (``TypeError: Unsupported type`` for a value
    JSON has no type for, such as a datetime), naming the argument.
    """
    try:
        return normalize_json(list(args)), normalize_json(dict(kwargs))
    except (TypeError, ValueError):
        labelled = [*((f"positional argument {i}", v) for i, v in enumerate(args)),
                    *((f"argument {k!r}", v) for k, v in dict(kwargs).items())]
        for label, value in labelled:
            try:
                normalize_json(value)
            except (TypeError, ValueError) as inner:
                kind = ValueError if isinstance(inner, ValueError) else TypeError
                raise kind(f"{task.module_path}: {label}: {inner}") from None
        raise


def _waiting_in_outbox(job_id: str, queues: Iterable[str]) -> EngineJob | None:
    """The job ``job_id`` as its outbox row describes it (status ``"outbox"``), if a row
    of one of ``queues`` (any queue when empty) waits for the relay."""
    from .models import OutboxEntry  # at the call: Django loads this backend with its apps

    rows = OutboxEntry.objects.filter(job_id=job_id)
    names = list(queues)
    if names:
        rows = rows.filter(queue__in=names)
    row = rows.first()
    if row is None:
        return None
    try:
        args, kwargs = json.loads(row.args), json.loads(row.kwargs)
    except ValueError:
        args, kwargs = [], {}
    return EngineJob(id=row.job_id, queue=row.queue, task_name=row.task_name, status=OUTBOX,
                     args=args, kwargs=kwargs, priority=row.priority, run_at=row.run_at,
                     max_attempts=row.max_attempts)


def _django_task(name: str) -> Task | None:
    """The Django task registered under ``name`` (importing its module if needed)."""
    known = _known.get(name)
    if known is not None:
        return known[0]
    try:
        found = import_string(name)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None


def build_result(task: Task, job: EngineJob, result_id: str, alias: str) -> TaskResult:
    """A ``TaskResult`` describing ``job`` (a job of ``task``) as last read."""
    run_after = job.run_at if job.run_at and job.enqueued_at and (
        job.run_at > job.enqueued_at) else None
    with contextlib.suppress(InvalidTask):
        task = dataclasses.replace(task, priority=job.priority, queue_name=job.queue,
                                   run_after=run_after)
    errors = []
    if job.error:
        errors.append(TaskError(exception_class_path=_error_class_path(job.error),
                                traceback=job.traceback or job.error))
    if job.status == Status.CANCELLED:
        errors.append(TaskError(exception_class_path=_CANCELLED_PATH,
                                traceback="The job was cancelled before it ran.\n"))
    status = STATUS_MAP.get(job.status, TaskResultStatus.READY)
    if status == TaskResultStatus.FAILED and not errors:  # damaged: its error was lost
        errors.append(TaskError(exception_class_path="builtins.Exception",
                                traceback="No error was recorded for this job.\n"))
    result = TaskResult(
        task=task, id=result_id, status=status, enqueued_at=job.enqueued_at,
        started_at=job.started_at, finished_at=job.finished_at if job.is_finished else None,
        last_attempted_at=job.started_at, args=list(job.args) if isinstance(job.args, list)
        else [], kwargs=dict(job.kwargs) if isinstance(job.kwargs, dict) else {},
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
    return path


def _worker_ids(job: EngineJob) -> list[str]:
    """The worker of each attempt, oldest first: the attempt log, plus the running one."""
    ids = [entry["worker"] for entry in job.attempt_log]
    logged = {entry["attempt"] for entry in job.attempt_log}
    if job.status == Status.ACTIVE and job.worker and job.attempts not in logged:
        ids.append(job.worker)
    return ids


def _running_result(task: Task, running: RunningJob | None, args: tuple[Any, ...],
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
    started = dt.datetime.fromtimestamp(job.started_at_ms / 1000, tz=dt.UTC)
    return TaskResult(
        task=task, id=make_result_id(job.queue, job.id), status=TaskResultStatus.RUNNING,
        enqueued_at=dt.datetime.fromtimestamp(job.enqueued_at_ms / 1000, tz=dt.UTC),
        started_at=started, finished_at=None, last_attempted_at=started, args=list(args),
        kwargs=dict(kwargs), backend=task.backend, errors=[],
        worker_ids=[running.worker] * max(1, job.attempt),
    )


def _send_finished(sender: type, result: TaskResult, outcome: Any, *,
                   raised: list[BaseException] | None = None) -> None:
    """Send ``task_finished`` for a job's final ``outcome`` (a worker ``Outcome``):
    SUCCESSFUL, FAILED when no retry follows, else READY (it will run again).

    ``raised`` holds what the task raised, if it did: the signal is then sent while that
    exception is being handled, as Django's own backends send it, so that receivers
    reading ``sys.exc_info()`` (Django's log line of a failed task) see it.
    """
    error = raised.pop() if raised else None
    if outcome.ok:
        status = TaskResultStatus.SUCCESSFUL
        object.__setattr__(result, "_return_value", json.loads(outcome.result_json))
    else:
        status = TaskResultStatus.FAILED if outcome.final else TaskResultStatus.READY
        result.errors.append(TaskError(exception_class_path=_error_class_path(outcome.error),
                                       traceback=outcome.traceback or outcome.error))
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    if error is None or outcome.ok:
        task_finished.send(sender, task_result=result)
        return
    try:
        raise error
    except BaseException:
        task_finished.send(sender, task_result=result)


def _call(task: Task, result: TaskResult, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``task``'s function (with its context when it takes one) and return its value
    as Django's backends keep it, through ``normalize_json``: a value that JSON has no
    type for (a datetime, a function) fails the task, as it does on Django's backends."""
    if task.takes_context:
        value = task.func(TaskContext(task_result=result), *args, **kwargs)
    else:
        value = task.func(*args, **kwargs)
    return _normalized_result(value)


def _normalized_result(value: Any) -> Any:
    """``value`` through ``normalize_json``; a value JSON has no type for raises Django's
    ``TypeError`` (``Unsupported type``) saying, as Django's backends do, that the return
    value "is not JSON serializable"."""
    try:
        return normalize_json(value)
    except TypeError as exc:
        raise TypeError(f"{exc}: the return value ({type(value).__name__}) is not JSON "
                        "serializable") from None


def _runner(task: Task) -> Callable[..., Any]:
    """The function a delayq worker calls for ``task``: the task's own, with its context
    (``takes_context``) and the Tasks signals ``task_started``/``task_finished``."""
    func = task.func

    def run(*args: Any, **kwargs: Any) -> Any:
        running = current_job()
        result = _running_result(task, running, args, kwargs)
        sender = type(task.get_backend())
        task_started.send(sender, task_result=result)
        if running is not None:
            # On a worker, task_finished waits for the job's final outcome: after the
            # return value is encoded, and for whatever the task raises.
            raised: list[BaseException] = []
            running.on_finished.append(
                functools.partial(_send_finished, sender, result, raised=raised))
            try:
                return _call(task, result, args, kwargs)
            except BaseException as exc:
                raised.append(exc)
                raise
        try:
            value = _call(task, result, args, kwargs)
        except Exception as exc:
            _failed(result, running, exc)
            task_finished.send(sender, task_result=result)
            raise
        _succeeded(result, value)
        task_finished.send(sender, task_result=result)
        return value

    if inspect.iscoroutinefunction(func):
        run = _normalizing(_async_runner(task))
    functools.update_wrapper(run, func)
    if task.takes_context:  # the caller's arguments exclude the leading ``context``
        sig = inspect.signature(func)
        run.__signature__ = sig.replace(  # type: ignore[attr-defined]
            parameters=list(sig.parameters.values())[1:])
    return run


def _normalizing(run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` (an async runner) returning its value through ``normalize_json``, as
    :func:`_call` does for sync tasks."""

    async def normalized(*args: Any, **kwargs: Any) -> Any:
        return _normalized_result(await run(*args, **kwargs))

    return normalized


def _async_runner(task: Task) -> Callable[..., Any]:
    """:func:`_runner` for an ``async def`` task: awaited on the worker's event loop,
    its signals sent with ``asend`` (sync receivers run through ``sync_to_async``)."""
    func = task.func

    async def run(*args: Any, **kwargs: Any) -> Any:
        running = current_job()
        result = _running_result(task, running, args, kwargs)
        sender = type(task.get_backend())
        await task_started.asend(sender, task_result=result)
        if running is not None:
            # On a worker, as for sync tasks: task_finished waits for the final outcome
            # (the worker calls the hook off the event loop, as asend runs sync receivers).
            running.on_finished.append(functools.partial(_send_finished, sender, result))
            if task.takes_context:
                return await func(TaskContext(task_result=result), *args, **kwargs)
            return await func(*args, **kwargs)
        try:
            if task.takes_context:
                value = await func(TaskContext(task_result=result), *args, **kwargs)
            else:
                value = await func(*args, **kwargs)
        except Exception as exc:
            _failed(result, running, exc)
            await task_finished.asend(sender, task_result=result)
            raise
        _succeeded(result, value)
        await task_finished.asend(sender, task_result=result)
        return value

    return run


def _failed(result: TaskResult, running: RunningJob | None, exc: Exception) -> None:
    """Mark ``result`` as failed by ``exc`` (READY again while attempts remain)."""
    last = running is None or running.job.attempt >= running.job.max_attempts
    status = TaskResultStatus.FAILED if last else TaskResultStatus.READY
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    result.errors.append(TaskError(
        exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
        traceback="".join(traceback.format_exception(exc))))


def _succeeded(result: TaskResult, value: Any) -> None:
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
