"""The registry of tasks: the only place a worker resolves a task name read from Redis.

The runtime runs what it finds here and never imports a path it reads. What it needs of
a task is :class:`Runnable`: the Django layer's ``django_delayq.task.Task`` is one (its
``@task`` registers each), and so is any object with these attributes (a test's own).
"""

from __future__ import annotations

import datetime as dt
import inspect
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from ..engine import UnknownTask
from .schedule import Schedule


class Runnable(Protocol):
    """What the runtime reads of a task: to run its jobs (``func``, ``timeout``,
    ``retry_delay``) and to enqueue its periodic occurrences (``schedule``, ``priority``,
    ``attempts_allowed``), in its queue."""

    @property
    def name(self) -> str: ...
    @property
    def func(self) -> Callable[..., Any]: ...
    @property
    def queue_name(self) -> str: ...
    @property
    def timeout(self) -> float | dt.timedelta | None: ...
    @property
    def schedule(self) -> Schedule | None: ...
    @property
    def priority(self) -> int: ...
    @property
    def attempts_allowed(self) -> int: ...

    def retry_delay(self, attempt: int) -> float: ...


class DuplicateTaskName(ValueError):
    """Two different functions registered under one task name."""


class TaskRegistry:
    """Registered tasks by name."""

    def __init__(self) -> None:
        self._tasks: dict[str, Runnable] = {}

    def register(self, task: Runnable) -> None:
        """Add ``task``; the same function registered again (a module imported twice)
        replaces itself, another function under the same name is refused."""
        existing = self._tasks.get(task.name)
        if existing is not None and existing.func is not task.func and (
            existing.func.__module__, existing.func.__qualname__
        ) != (task.func.__module__, task.func.__qualname__):
            raise DuplicateTaskName(
                f"two tasks are named {task.name!r}: {existing.func.__module__}."
                f"{existing.func.__qualname__} and {task.func.__module__}."
                f"{task.func.__qualname__}; give one of them @task(name=...)"
            )
        self._tasks[task.name] = task

    def get(self, name: str) -> Runnable:
        try:
            return self._tasks[name]
        except KeyError:
            raise UnknownTask(
                f"no task named {name!r} is registered in this worker: is it defined in an "
                "installed app's tasks.py (or a module imported at start-up)?"
            ) from None

    def find(self, name: str) -> Runnable | None:
        """The task named ``name``, or None."""
        return self._tasks.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tasks

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._tasks))

    def __len__(self) -> int:
        return len(self._tasks)

    def tasks(self) -> list[Runnable]:
        return [self._tasks[name] for name in sorted(self._tasks)]

    def queues(self) -> list[str]:
        """The queues registered tasks send jobs to."""
        return sorted({t.queue_name for t in self._tasks.values()})

    def only_async(self, queue: str) -> bool:
        """Whether every task that sends jobs to ``queue`` is ``async def`` (and one does)."""
        kinds = {is_async(t) for t in self._tasks.values() if t.queue_name == queue}
        return kinds == {True}

    def periodic(self, queues: Iterable[str]) -> list[Runnable]:
        """The periodic tasks (cron or every) that send jobs to one of ``queues``."""
        wanted = set(queues)
        return [t for t in self.tasks() if t.schedule is not None and t.queue_name in wanted]


def is_async(task: Runnable) -> bool:
    """Whether ``task`` is an ``async def`` function (run on a worker's event loop)."""
    return inspect.iscoroutinefunction(task.func)


def timeout_seconds(task: Runnable) -> float | None:
    """``task``'s time limit in seconds (None: it sets none)."""
    limit = task.timeout
    if limit is None:
        return None
    return limit.total_seconds() if isinstance(limit, dt.timedelta) else float(limit)


#: The registry ``@task`` fills (by importing each installed app's ``tasks`` module).
registry = TaskRegistry()
