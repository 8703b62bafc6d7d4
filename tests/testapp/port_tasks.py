"""The tasks of Django's own Tasks tests (``tests/tasks/tasks.py`` of Django 6.0 and 6.1,
``tests/tasks.py`` of the django-tasks backport), under the same names, for the port in
``tests/test_django_tasks_port.py`` and ``tests/test_django_tasks_port_workers.py``.

Async tasks use a queue of their own, as the other async tasks of the test app do, so
that workers of the ``default`` queue need no event loop. For ``hang`` and
``sleep_for`` the tests use ``standard_tasks.dj_gated``, which waits for a key they set.
"""

from __future__ import annotations

from typing import Any

from django_delayq.connection import get_broker

try:
    from django.tasks import TaskContext, task
except ImportError:  # the django-tasks backport on Django 5.2
    from django_tasks import TaskContext, task

@task()
def noop_task(*args: Any, **kwargs: Any) -> None:
    return None


@task
def noop_task_from_bare_decorator(*args: Any, **kwargs: Any) -> None:
    return None


@task(queue_name="async")
async def noop_task_async(*args: Any, **kwargs: Any) -> None:
    return None


@task()
def calculate_meaning_of_life() -> int:
    return 42


@task()
def failing_task_value_error() -> None:
    raise ValueError("This Task failed due to ValueError")


@task()
def failing_task_system_exit() -> None:
    raise SystemExit("This Task failed due to SystemExit")


@task()
def failing_task_keyboard_interrupt() -> None:
    raise KeyboardInterrupt("This Task failed due to KeyboardInterrupt")


@task()
def complex_exception() -> None:
    raise ValueError(ValueError("This task failed"))


@task()
def complex_return_value() -> Any:
    # Return something which isn't JSON serializable nor picklable.
    return lambda: True


@task(queue_name="async")
async def complex_return_value_async() -> Any:
    return lambda: True


@task()
def exit_task() -> None:
    exit(1)


@task(takes_context=True)
def get_task_id(context: TaskContext) -> str:
    return context.task_result.id


@task(takes_context=True)
def check_context(context: TaskContext, attempt: int) -> None:
    """Django's ``test_context`` task (renamed: it is not a test)."""
    assert isinstance(context, TaskContext)
    assert context.attempt == attempt


@task()
def record_tag(tag: str) -> str:
    """Append ``tag`` to the list ``test:port:ran``: the order jobs ran in."""
    get_broker().client.rpush("test:port:ran", tag)
    return tag

