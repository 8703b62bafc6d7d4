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

import json
import logging
import threading
from collections.abc import Iterable
from typing import Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

from ..conf import django_time
from ..engine import DelayQError, JobNotFound
from ..engine import Job as EngineJob
from ..engine.keys import QUEUE_NAME_RE
from ..engine.logfields import log
from ..engine.status import OUTBOX, Status
from ..task import Task as DelayQTask
from ..task import registry
from .framework import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from .results import (
    STATUS_MAP,
    JobCancelled,
    build_result,
    make_result_id,
    parse_result_id,
)
from .runner import make_runner

__all__ = ["STATUS_MAP", "DelayQBackend", "JobCancelled", "TaskResultStatus", "make_result_id",
           "parse_result_id"]

logger = logging.getLogger("django_delayq.backends")

OPTIONS = {"MAX_ATTEMPTS", "OUTBOX"}

_lock = threading.Lock()
#: module_path -> (the Django task first declared under it, its registered delayq task)
_known: dict[str, tuple[Task, DelayQTask[Any, Any]]] = {}


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
                    func=make_runner(task), name=name, queue=task.queue_name,
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
            configured.check_arguments(args, kwargs)
            job = configured.enqueue_to_redis(tuple(args), kwargs)  # DELAYQ['EAGER'] aside
        result = TaskResult(
            task=task, id=make_result_id(job.queue, job.id), status=TaskResultStatus.READY,
            enqueued_at=django_time(job.enqueued_at), started_at=None, finished_at=None,
            last_attempted_at=None, args=list(args), kwargs=dict(kwargs), backend=self.alias,
            errors=[], worker_ids=[],
        )
        log(logger, logging.DEBUG, "enqueued", job=job.id, queue=job.queue,
            task=task.module_path)

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
        job = _in_redis(job_id, queues)
        if job is None and self.outbox:
            # a row sent and deleted between the two reads is in Redis by the third
            job = _waiting_in_outbox(job_id, queues) or _in_redis(job_id, queues)
        if job is not None:
            return self._result(job, make_result_id(job.queue, job_id))
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


def _in_redis(job_id: str, queues: Iterable[str]) -> EngineJob | None:
    """The job ``job_id`` of the first of ``queues`` that holds it."""
    for name in queues:
        try:
            return EngineJob.fetch(job_id, name)
        except (JobNotFound, ValueError):
            continue
    return None


def _waiting_in_outbox(job_id: str, queues: Iterable[str]) -> EngineJob | None:
    """The job ``job_id`` as its outbox row describes it, if a row of one of ``queues``
    (any queue when empty) holds it: status ``"outbox"`` while it waits for the relay,
    ``"failed"`` with the refusal as its error once the relay parked it (Redis or the
    checks refused it: it runs only if an operator sends it again)."""
    from ..models import OutboxEntry  # at the call: Django loads this backend with its apps

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
    parked = row.parked_at is not None
    refusal = row.error or "Exception: parked by the relay"
    return EngineJob(id=row.job_id, queue=row.queue, task_name=row.task_name,
                     status=Status.FAILED if parked else OUTBOX, args=args, kwargs=kwargs,
                     priority=row.priority, run_at=row.run_at, max_attempts=row.max_attempts,
                     enqueued_at=row.created_at, error=refusal if parked else None,
                     finished_at=row.parked_at)


def _django_task(name: str) -> Task | None:
    """The Django task registered under ``name``, importing its module if needed: only
    a module of an installed app, as the name was read from Redis (any module imported
    there runs its code in this process)."""
    known = _known.get(name)
    if known is not None:
        return known[0]
    if apps.get_containing_app_config(name) is None:
        return None
    try:
        found = import_string(name)
    except ImportError:
        return None
    return found if isinstance(found, Task) else None
