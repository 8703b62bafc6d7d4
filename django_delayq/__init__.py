"""django-delayq: delayed and scheduled background jobs for Django on Redis.

Public API::

    from django_delayq import task, Job, JobSpec, Queue, chain, group

Names are loaded on first use, so importing the engine alone (``django_delayq.engine``,
as Spark executors do) does not load Django.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0.dev0"

_EXPORTS = {
    "task": "django_delayq.task",
    "Task": "django_delayq.task",
    "JobSpec": "django_delayq.task",
    "registry": "django_delayq.task",
    "chain": "django_delayq.workflows",
    "group": "django_delayq.workflows",
    "Job": "django_delayq.engine",
    "Queue": "django_delayq.engine",
    "DelayQError": "django_delayq.engine",
    "DelayQConnectionError": "django_delayq.engine",
    "InvalidJobState": "django_delayq.engine",
    "JobNotFound": "django_delayq.engine",
    "JobAborted": "django_delayq.engine",
    "JobTimeout": "django_delayq.engine",
    "NotReplicated": "django_delayq.engine",
    "PayloadTooLarge": "django_delayq.engine",
    "UnknownTask": "django_delayq.engine",
}

__all__ = [
    "DelayQConnectionError",
    "DelayQError",
    "InvalidJobState",
    "Job",
    "JobAborted",
    "JobNotFound",
    "JobSpec",
    "JobTimeout",
    "NotReplicated",
    "PayloadTooLarge",
    "Queue",
    "Task",
    "UnknownTask",
    "__version__",
    "chain",
    "group",
    "registry",
    "task",
]

if TYPE_CHECKING:
    from .engine import (
        DelayQConnectionError,
        DelayQError,
        InvalidJobState,
        Job,
        JobAborted,
        JobNotFound,
        JobTimeout,
        NotReplicated,
        PayloadTooLarge,
        Queue,
        UnknownTask,
    )
    from .task import JobSpec, Task, registry, task
    from .workflows import chain, group


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'django_delayq' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
