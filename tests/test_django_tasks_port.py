"""Django's own Tasks tests (``tests/tasks/`` of Django 6.0 and 6.1, and of the
django-tasks backport used on Django 5.2), the cases any backend's results must pass,
run on delayq.

Only how a task runs differs. Django's ``test_immediate_backend.py`` runs each task
inside ``enqueue()``; here ``enqueue()`` returns a READY result, a delayq worker runs the
job (``run_jobs``: ``runworker --burst`` in this process, from
``django_delayq.contrib.pytest``) and the test reads the outcome back with ``refresh()``.
Django's ``test_tasks.py`` runs on its dummy backend; here on delayq's. Where delayq
differs on purpose, the test says why. The cases of the backport's worker and RQ backend
tests are in ``test_django_tasks_port_workers.py``.

Not ported, because no backend is in play: Django's tests of ``Task.call()``, of
unknown or missing backend aliases, of ``name`` and ``module_path``, of unpickling
arbitrary strings, of ``@task(run_after=...)``, and ``test_dummy_backend.py`` and
``test_custom_backend.py`` (backends of their own).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import pickle
from collections.abc import Callable
from typing import Any

import django
import pytest
from django.db import transaction
from django.utils import timezone

from django_delayq import Queue
from django_delayq.backends import DelayQBackend
from django_delayq.task import registry
from tests.testapp import port_tasks as test_tasks

try:  # Django 6+
    from django.tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task
    from django.tasks.exceptions import (
        InvalidTask,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
except ImportError:  # the django-tasks backport on Django 5.2
    from django_tasks import (
        DEFAULT_TASK_QUEUE_NAME,
        TaskResultStatus,
        default_task_backend,
        task,
        task_backends,
    )
    from django_tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch

#: The logger of the Tasks signals' receivers (the backport names it after its package).
TASKS_LOGGER = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"

# An async job checks the connections of sync_to_async's thread, which an earlier test
# may have opened: database access must be allowed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tasks_log(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """The lines logged to :data:`TASKS_LOGGER` so far (level, message and traceback,
    as ``assertLogs`` shows them); ``caplog.clear()`` starts again."""
    caplog.set_level(logging.DEBUG, logger=TASKS_LOGGER)
    formatter = logging.Formatter("%(levelname)s:%(name)s:%(message)s")

    def lines() -> list[str]:
        return [formatter.format(r) for r in caplog.records if r.name == TASKS_LOGGER]

    return lines


def assert_timestamps(result: Any) -> None:
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at


def errors_logged(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("ERROR:")]


#: Enqueue (``task, *args``) from sync code, or from async code.
ENQUEUE: dict[str, Callable[..., Any]] = {
    "enqueue": lambda task, *args: task.enqueue(*args),
    "aenqueue": lambda task, *args: asyncio.run(task.aenqueue(*args)),
}
#: Fetch a result (``task, result_id``) from sync code, or from async code.
GET_RESULT: dict[str, Callable[..., Any]] = {
    "get_result": lambda task, result_id: task.get_result(result_id),
    "aget_result": lambda task, result_id: asyncio.run(task.aget_result(result_id)),
}


# -- test_immediate_backend.py --------------------------------------------------------


def test_using_correct_backend() -> None:
    assert default_task_backend == task_backends["default"]
    assert isinstance(task_backends["default"], DelayQBackend)
    assert default_task_backend.alias == "default"
    assert default_task_backend.options == {}


@pytest.mark.parametrize("task", [test_tasks.noop_task, test_tasks.noop_task_async],
                         ids=["sync", "async"])
def test_enqueue_task(task: Any, run_jobs: Any) -> None:
    result = task.enqueue(1, two=3)
    # delayq: enqueue() returns at once with a READY result; a worker runs the job later
    assert result.status == TaskResultStatus.READY
    assert run_jobs() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished is True
    assert_timestamps(result)
    assert result.return_value is None
    assert result.task == task
    assert result.args == [1]
    assert result.kwargs == {"two": 3}
    assert result.attempts == 1


@pytest.mark.parametrize("task", [test_tasks.noop_task, test_tasks.noop_task_async],
                         ids=["sync", "async"])
def test_enqueue_task_async(task: Any, run_jobs: Any) -> None:
    result = asyncio.run(task.aenqueue())
    assert result.status == TaskResultStatus.READY
    run_jobs()
    asyncio.run(result.arefresh())
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished is True
    assert_timestamps(result)
    assert result.return_value is None
    assert result.task == task
    assert (result.args, result.kwargs, result.attempts) == ([], {}, 1)


@pytest.mark.parametrize(("task", "exception", "message"), [
    (test_tasks.failing_task_value_error, ValueError, "This Task failed due to ValueError"),
    (test_tasks.failing_task_system_exit, SystemExit, "This Task failed due to SystemExit"),
], ids=["ValueError", "SystemExit"])
def test_catches_exception(task: Any, exception: type[BaseException], message: str,
                           run_jobs: Any, tasks_log: Callable[[], list[str]]) -> None:
    result = task.enqueue()
    run_jobs()
    errors = errors_logged(tasks_log())
    assert len(errors) == 1
    assert message in errors[0]  # the task's exception, logged with its traceback
    assert result.id in errors[0]

    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert result.is_finished is True
    assert_timestamps(result)
    assert result.errors[0].exception_class is exception
    traceback = result.errors[0].traceback
    assert traceback
    assert traceback.endswith(f"{exception.__name__}: {message}\n"), traceback
    assert result.task == task
    assert (result.args, result.kwargs) == ([], {})


def test_throws_keyboard_interrupt(run_jobs: Any, tasks_log: Callable[[], list[str]]) -> None:
    """delayq differs: Django's immediate backend runs the task inside ``enqueue()`` and
    lets a ``KeyboardInterrupt`` through, as the caller's own Ctrl-C. On delayq the task
    runs on a worker, where a ``KeyboardInterrupt`` the task raises is not a Ctrl-C
    (``runworker`` handles SIGINT itself and never raises it into a job): the job fails
    with it and the worker goes on, as the backport's database worker does (its cases
    are in ``test_django_tasks_port_workers.py``)."""
    result = default_task_backend.enqueue(test_tasks.failing_task_keyboard_interrupt, [], {})
    assert result.status == TaskResultStatus.READY
    assert errors_logged(tasks_log()) == []
    run_jobs()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is KeyboardInterrupt


def test_complex_exception(run_jobs: Any, tasks_log: Callable[[], list[str]]) -> None:
    result = test_tasks.complex_exception.enqueue()
    run_jobs()
    assert errors_logged(tasks_log())
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert_timestamps(result)
    assert result._return_value is None
    assert result.errors[0].exception_class is ValueError
    assert 'ValueError(ValueError("This task failed"))' in result.errors[0].traceback
    assert result.task == test_tasks.complex_exception
    assert (result.args, result.kwargs) == ([], {})


def test_complex_return_value(run_jobs: Any, tasks_log: Callable[[], list[str]]) -> None:
    result = test_tasks.complex_return_value.enqueue()
    run_jobs()
    assert errors_logged(tasks_log())
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert_timestamps(result)
    assert result._return_value is None
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type" in result.errors[0].traceback
    assert "is not JSON serializable" in result.errors[0].traceback


def test_complex_return_value_async(run_jobs: Any) -> None:
    """Not in Django's tests: an async task's return value is kept as a sync task's."""
    result = test_tasks.complex_return_value_async.enqueue()
    run_jobs()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is TypeError
    assert "Unsupported type" in result.errors[0].traceback
    assert "is not JSON serializable" in result.errors[0].traceback


def test_result(run_jobs: Any) -> None:
    result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, [], {})
    run_jobs()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


def test_result_async(run_jobs: Any) -> None:
    result = asyncio.run(default_task_backend.aenqueue(
        test_tasks.calculate_meaning_of_life, [], {}))
    run_jobs()
    asyncio.run(result.arefresh())
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


def test_can_get_and_refresh_result(run_jobs: Any) -> None:
    """delayq differs: the immediate backend keeps no results (its
    ``test_cannot_get_result`` and ``test_cannot_refresh_result``); delayq keeps them in
    Redis, so every process can read and refresh them."""
    assert default_task_backend.supports_get_result is True
    result = asyncio.run(default_task_backend.aenqueue(
        test_tasks.calculate_meaning_of_life, (), {}))
    run_jobs()
    assert default_task_backend.get_result(result.id).return_value == 42
    assert asyncio.run(default_task_backend.aget_result(result.id)).return_value == 42
    asyncio.run(result.arefresh())
    assert result.return_value == 42
    result.refresh()
    assert result.return_value == 42


def test_can_pass_run_after() -> None:
    """delayq differs: it supports ``run_after`` (the immediate backend refuses it)."""
    assert default_task_backend.supports_defer is True
    default_task_backend.validate_task(
        test_tasks.failing_task_value_error.using(run_after=timezone.now()))


@pytest.mark.parametrize(("task", "state"), [
    (test_tasks.noop_task, "SUCCESSFUL"), (test_tasks.failing_task_value_error, "FAILED"),
], ids=["test_enqueue_logs", "test_failed_logs"])
def test_enqueue_logs(task: Any, state: str, run_jobs: Any,
                      tasks_log: Callable[[], list[str]]) -> None:
    result = task.enqueue()
    run_jobs()
    lines = tasks_log()
    assert len(lines) == 3
    assert "enqueued" in lines[0]
    assert "state=RUNNING" in lines[1]
    assert f"state={state}" in lines[2]
    for line in lines:
        assert result.id in line


def test_successful_task_no_none_in_logs(run_jobs: Any,
                                         tasks_log: Callable[[], list[str]]) -> None:
    result = test_tasks.noop_task.enqueue()
    run_jobs()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert tasks_log()
    for line in tasks_log():
        assert "None" not in line


def test_takes_context(run_jobs: Any) -> None:
    result = test_tasks.get_task_id.enqueue()
    run_jobs()
    result.refresh()
    assert result.return_value == result.id


def test_context(run_jobs: Any) -> None:
    result = test_tasks.check_context.enqueue(1)
    run_jobs()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("enqueue", ["enqueue", "aenqueue"])
def test_validate_on_enqueue(enqueue: str, settings: Any) -> None:
    backend = "django_delayq.backends.DelayQBackend"
    settings.TASKS = {"default": {"BACKEND": backend, "QUEUES": []}}
    task_with_custom_queue_name = test_tasks.noop_task.using(queue_name="unknown_queue")
    settings.TASKS = {"default": {"BACKEND": backend, "QUEUES": ["queue-1"]}}
    with pytest.raises(InvalidTask, match="Queue 'unknown_queue' is not valid for backend"):
        ENQUEUE[enqueue](task_with_custom_queue_name)
    assert sum(Queue("unknown_queue").counts().values()) == 0


def test_doesnt_wait_until_transaction_commit_by_default() -> None:
    with transaction.atomic():
        result = test_tasks.noop_task.enqueue()
        assert result.enqueued_at is not None
        # delayq: the job is in Redis at once (the immediate backend has run it by now);
        # OPTIONS["OUTBOX"] makes enqueue() wait for the commit instead.
        assert Queue(DEFAULT_TASK_QUEUE_NAME).counts()["ready"] == 1
    assert default_task_backend.get_result(result.id).status == TaskResultStatus.READY


def test_check() -> None:
    """The backport's ``test_check``: a well configured backend reports nothing."""
    assert list(default_task_backend.check()) == []


# -- test_tasks.py ---------------------------------------------------------------------


def test_task_decorator() -> None:
    assert isinstance(test_tasks.noop_task, Task)
    assert isinstance(test_tasks.noop_task_async, Task)
    assert isinstance(test_tasks.noop_task_from_bare_decorator, Task)


@pytest.mark.parametrize("enqueue", ["enqueue", "aenqueue"])
def test_enqueue_task_is_stored(enqueue: str) -> None:
    """Django's ``test_enqueue_task`` (dummy backend): the result is READY and kept."""
    result = ENQUEUE[enqueue](test_tasks.noop_task)
    assert result.status == TaskResultStatus.READY
    assert result.task == test_tasks.noop_task
    assert (result.args, result.kwargs) == ([], {})
    assert default_task_backend.get_result(result.id) == result


@pytest.mark.parametrize("enqueue", ["enqueue", "aenqueue"])
def test_enqueue_with_invalid_argument(enqueue: str) -> None:
    with pytest.raises(TypeError, match="Unsupported type"):
        ENQUEUE[enqueue](test_tasks.noop_task, dt.datetime.now())
    # delayq: refused before anything is written
    assert sum(Queue(DEFAULT_TASK_QUEUE_NAME).counts().values()) == 0


def test_arguments_are_normalized_as_django_keeps_them(run_jobs: Any) -> None:
    """What the task receives is what ``result.args`` says: JSON's types (a tuple is a
    list, bytes are text), as on every Tasks backend."""
    result = test_tasks.record_tag.enqueue(tag=b"bytes")
    assert result.kwargs == {"tag": "bytes"}
    run_jobs()
    result.refresh()
    assert result.return_value == "bytes"


def test_using() -> None:
    """Django's ``test_using_priority``, ``_queue_name``, ``_run_after``,
    ``_creates_new_instance`` and ``test_chained_using``, validated by delayq's backend."""
    noop = test_tasks.noop_task
    assert noop.priority == 0
    assert noop.using(priority=1).priority == 1
    assert noop.priority == 0
    assert noop.queue_name == DEFAULT_TASK_QUEUE_NAME
    assert noop.using(queue_name="other").queue_name == "other"
    assert noop.queue_name == DEFAULT_TASK_QUEUE_NAME
    now = timezone.now()
    assert noop.run_after is None
    assert noop.using(run_after=now).run_after == now
    assert noop.run_after is None
    new_task = noop.using()
    assert new_task == noop
    assert new_task is not noop
    run_after_task = noop.using(run_after=now)
    priority_task = run_after_task.using(priority=10)
    assert (priority_task.priority, priority_task.run_after) == (10, now)
    assert run_after_task.priority == 0


def test_refresh_result() -> None:
    result = asyncio.run(test_tasks.noop_task.aenqueue())
    original_result = dataclasses.asdict(result)
    result.refresh()
    assert dataclasses.asdict(result) == original_result
    asyncio.run(result.arefresh())
    assert dataclasses.asdict(result) == original_result


def test_naive_datetime() -> None:
    with pytest.raises(InvalidTask, match="run_after must be an aware datetime"):
        test_tasks.noop_task.using(run_after=dt.datetime.now())


def test_invalid_priority() -> None:
    message = (f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
               f"{TASK_MAX_PRIORITY}")
    for priority in (-101, 101, 3.1):
        with pytest.raises(InvalidTask, match=message):
            test_tasks.noop_task.using(priority=priority)
    for priority in (100, -100, 0):
        test_tasks.noop_task.using(priority=priority)


def test_unknown_queue_name(settings: Any) -> None:
    with pytest.raises(InvalidTask, match="Queue 'queue-2' is not valid for backend"):
        test_tasks.noop_task.using(queue_name="queue-2")
    # Validation is bypassed when the backend QUEUES is an empty list.
    settings.TASKS = {"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                                  "QUEUES": []}}
    assert test_tasks.noop_task.using(queue_name="queue-2").queue_name == "queue-2"


@pytest.mark.parametrize("get", ["get_result", "aget_result"])
def test_get_result(get: str) -> None:
    result = default_task_backend.enqueue(test_tasks.noop_task, (), {})
    assert GET_RESULT[get](test_tasks.noop_task, result.id) == result


def test_get_missing_result() -> None:
    for get in GET_RESULT.values():
        with pytest.raises(TaskResultDoesNotExist):
            get(test_tasks.noop_task, "123")


@pytest.mark.parametrize("get", ["get_result", "aget_result"])
def test_get_incorrect_result(get: str) -> None:
    result = default_task_backend.enqueue(test_tasks.noop_task_async, (), {})
    with pytest.raises(TaskResultMismatch, match="Task does not match"):
        GET_RESULT[get](test_tasks.noop_task, result.id)


def test_invalid_function() -> None:
    def not_module_level() -> None: ...

    registered = len(registry)
    for invalid_function in [any, not_module_level]:
        with pytest.raises(InvalidTask,
                           match="Task function must be defined at a module level"):
            task()(invalid_function)
    assert len(registry) == registered  # delayq: nothing was registered for workers


@pytest.mark.skipif(django.VERSION < (6, 1), reason="tasks pickle from Django 6.1")
def test_pickle_task() -> None:
    assert pickle.loads(pickle.dumps(test_tasks.noop_task)) == test_tasks.noop_task


@pytest.mark.skipif(django.VERSION < (6, 1), reason="tasks pickle from Django 6.1")
def test_pickle_task_result(run_jobs: Any) -> None:
    result = test_tasks.calculate_meaning_of_life.enqueue()
    assert pickle.loads(pickle.dumps(result)) == result
    run_jobs()
    result.refresh()  # a result read back from Redis pickles too
    assert pickle.loads(pickle.dumps(result)) == result


@pytest.mark.parametrize(("path", "error", "message"), [
    ("subprocess.run", ValueError, "'subprocess.run' does not reference a valid exception"),
    ("does.not.exist", ImportError, None),
])
def test_task_error_invalid_exception(path: str, error: type[Exception], message: str | None,
                                      run_jobs: Any) -> None:
    """Django's ``test_task_error_invalid_exception`` and ``_unknown_module``."""
    result = test_tasks.failing_task_value_error.enqueue()
    run_jobs()
    result.refresh()
    assert len(result.errors) == 1
    object.__setattr__(result.errors[0], "exception_class_path", path)
    with pytest.raises(error, match=message):
        _ = result.errors[0].exception_class


def test_takes_context_without_taking_context() -> None:
    with pytest.raises(InvalidTask, match="Task takes context but does not have a first "
                                          "argument of 'context'"):
        task(takes_context=True)(test_tasks.calculate_meaning_of_life.func)

