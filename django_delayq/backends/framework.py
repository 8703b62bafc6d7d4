"""Django's Tasks framework, from wherever this install has it: ``django.tasks`` on
Django 6, the ``django-tasks`` package on Django 5.2 (the ``tasks`` extra)."""

from __future__ import annotations

from ..engine.errors import ExtraMissing

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
        raise ExtraMissing("django_delayq.backends on Django 5.2", "the django-tasks package",
                           "tasks", " (Django 6 has the Tasks framework built in)") from exc

__all__ = ["BaseTaskBackend", "InvalidTask", "Task", "TaskContext", "TaskError",
           "TaskResult", "TaskResultDoesNotExist", "TaskResultStatus", "normalize_json",
           "task_enqueued", "task_finished", "task_started"]
