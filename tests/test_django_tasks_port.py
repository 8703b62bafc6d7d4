"""The backend-generic cases of Django's own Tasks tests (``tests/tasks/``, Django 6.0:
what any backend's results must say), run by delayq's worker instead of in the caller.

Only how a task runs differs from Django's tests: they use the immediate backend, which
runs the task inside ``enqueue()``; here a delayq worker runs it and the test reads the
result back with ``refresh()``. Where delayq differs on purpose, the test says why.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import wait_until, worker_thread
from tests.testapp import standard_tasks as st

try:  # Django 6+
    from django.tasks import TaskResultStatus
    from django.tasks.exceptions import InvalidTask
except ImportError:  # the django-tasks backport on Django 5.2
    from django_tasks import TaskResultStatus
    from django_tasks.exceptions import InvalidTaskError as InvalidTask

# An async job checks the connections of sync_to_async's thread, which an earlier test
# may have opened: database access must be allowed.
pytestmark = pytest.mark.django_db(transaction=True)


def run(result: Any) -> Any:
    """Run ``result``'s job on a delayq worker and return the refreshed result."""
    with worker_thread(queues=[result.task.queue_name], concurrency=1):
        wait_until(lambda: (result.refresh(), result.is_finished)[1],
                   message=f"{result.task.name} to finish")
    return result


def assert_timestamps(result: Any) -> None:
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at


@pytest.mark.parametrize("task", [st.dj_noop, st.dj_noop_async], ids=["sync", "async"])
def test_enqueue_task(task):
    result = task.enqueue(1, two=3)
    # delayq: enqueue() returns at once with a READY result; the worker runs it later
    assert result.status == TaskResultStatus.READY
    run(result)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished
    assert_timestamps(result)
    assert result.return_value is None
    assert result.task.func is task.func
    assert result.args == [1]
    assert result.kwargs == {"two": 3}
    assert result.attempts == 1


@pytest.mark.parametrize("task", [st.dj_noop, st.dj_noop_async], ids=["sync", "async"])
def test_aenqueue_task(task):
    result = run(asyncio.run(task.aenqueue()))
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert_timestamps(result)
    assert (result.args, result.kwargs, result.attempts) == ([], {}, 1)


def test_an_exception_fails_the_task():
    result = run(st.dj_value_error.enqueue())
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert_timestamps(result)
    assert result.errors[0].exception_class is ValueError
    assert result.errors[0].traceback.endswith("ValueError: This task failed on purpose\n")
    assert (result.args, result.kwargs) == ([], {})


def test_a_complex_exception_keeps_its_traceback():
    result = run(st.dj_nested_error.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is ValueError
    assert 'raise ValueError(ValueError("nested"))' in result.errors[0].traceback


def test_a_return_value_that_is_not_json_fails_the_task():
    result = run(st.dj_not_json.enqueue())
    assert result.status == TaskResultStatus.FAILED
    assert_timestamps(result)
    assert result.errors[0].exception_class is TypeError
    # delayq's JSON encoder names the type it cannot encode
    assert "set" in result.errors[0].traceback


def test_result():
    result = run(st.dj_forty_two.enqueue())
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 42


def test_result_async():
    result = run(asyncio.run(st.dj_forty_two.aenqueue()))
    assert result.return_value == 42


def test_results_can_be_fetched_and_refreshed():
    # Django's immediate backend cannot fetch results; delayq keeps them in Redis
    result = run(st.dj_forty_two.enqueue())
    assert st.dj_forty_two.get_result(result.id).return_value == 42
    assert asyncio.run(st.dj_forty_two.aget_result(result.id)).return_value == 42


def test_takes_context():
    result = run(st.dj_own_id.enqueue())
    assert result.return_value == result.id


def test_validate_on_enqueue(settings):
    settings.TASKS = {"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                                  "QUEUES": ["queue-1"]}}
    with pytest.raises(InvalidTask, match="unknown_queue"):
        st.dj_noop.using(queue_name="unknown_queue").enqueue()
    with pytest.raises(InvalidTask, match="unknown_queue"):
        asyncio.run(st.dj_noop.using(queue_name="unknown_queue").aenqueue())
