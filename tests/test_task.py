"""``@task`` and ``Task``: declaring, validating and enqueuing."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pytest
from django.db import transaction

from django_delayq import Job, Queue, Task, registry, task
from django_delayq.engine import PayloadTooLarge
from tests.testapp import tasks


def test_task_name_is_module_and_qualname():
    assert tasks.record.name == "tests.testapp.tasks.record"
    assert registry.get(tasks.record.name) is tasks.record
    assert isinstance(tasks.record, Task)


def test_plain_call_runs_in_process():
    assert tasks.add(2, 3) == 5
    assert tasks.add.call(2, b=5) == 7


def test_enqueue_returns_a_job_with_its_options(redis_client):
    run_at = dt.datetime(2031, 5, 17, 9, 30, tzinfo=dt.UTC)
    job = tasks.add.using(run_at=run_at, priority=10, job_id="sum-1").enqueue(1, b=2)
    assert (job.id, job.queue, job.status, job.priority) == ("sum-1", "default", "scheduled", 10)
    assert job.run_at == run_at
    assert job.created is True
    fetched = Job.fetch("sum-1")
    assert (fetched.args, fetched.kwargs, fetched.task_name) == ([1], {"b": 2}, tasks.add.name)
    assert fetched.max_attempts == 3


def test_using_returns_a_copy():
    delayed = tasks.add.using(delay=dt.timedelta(minutes=5), queue="other")
    assert (delayed.delay, delayed.queue_name) == (dt.timedelta(minutes=5), "other")
    assert (tasks.add.delay, tasks.add.queue_name) == (None, "default")
    assert delayed.using(run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC)).delay is None


def test_django_types_are_encoded_as_json(redis_client):
    job = tasks.record.enqueue("t", extra={
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "price": decimal.Decimal("9.99"),
        "id": uuid.UUID(int=1), "day": dt.date(2026, 1, 2)})
    assert Job.fetch(job.id).kwargs["extra"] == {
        "when": "2026-01-02T03:04:05Z", "price": "9.99",
        "id": "00000000-0000-0000-0000-000000000001", "day": "2026-01-02"}


def test_non_json_argument_is_refused_naming_it(redis_client):
    with pytest.raises(TypeError, match=r"argument 'tag' \(position 0\) \(object\) is not JSON"):
        tasks.record.enqueue(object())
    with pytest.raises(TypeError, match=r"argument 'extra' \(set\) is not JSON"):
        tasks.record.enqueue("x", extra={1, 2})
    with pytest.raises(TypeError, match="not JSON serializable"):
        tasks.record.enqueue("x", extra=float("nan"))
    assert sum(Queue("default").counts().values()) == 0


def test_wrong_arguments_are_refused_before_anything_is_sent(redis_client):
    with pytest.raises(TypeError, match=r"tasks\.add: missing a required argument: 'b'"):
        tasks.add.enqueue(1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'c'"):
        tasks.add.enqueue(1, 2, c=3)
    assert sum(Queue("default").counts().values()) == 0


def _three(a, b, c=3):  # only its signature matters
    pass


def _varargs(a, *rest, key=None):
    pass


@pytest.mark.parametrize("func", [_three, _varargs])
@pytest.mark.parametrize(("args", "kwargs"), [
    ((), {}), ((1,), {}), ((1, 2), {}), ((1, 2, 3), {}), ((1, 2, 3, 4), {}),
    ((), {"a": 1, "b": 2}), ((1,), {"b": 2}), ((1,), {"c": 2}), ((1,), {"a": 2, "b": 3}),
    ((1, 2), {"c": 3}), ((1, 2), {"d": 3}), ((1, 2), {"key": 3}), ((), {"b": 1, "c": 2}),
    ((1,), {1: 2}),
])
def test_argument_check_agrees_with_signature_bind(func, args, kwargs):
    import inspect

    try:
        inspect.signature(func).bind(*args, **kwargs)
        expected = None
    except TypeError as exc:
        expected = f"tests.check: {exc}"
    checked = Task(func=func, name="tests.check")
    if expected is None:
        checked.check_arguments(args, kwargs)
    else:
        with pytest.raises(TypeError) as info:
            checked.check_arguments(args, kwargs)
        assert str(info.value) == expected


def test_naive_datetimes_are_refused():
    with pytest.raises(ValueError, match="naive datetime"):
        tasks.add.using(run_at=dt.datetime(2030, 1, 1))


@pytest.mark.parametrize(("priority", "error"), [
    (101, ValueError), (-101, ValueError), (1.5, TypeError), (True, TypeError), ("1", TypeError),
])
def test_out_of_range_priorities_are_refused(priority, error):
    with pytest.raises(error, match="priority"):
        tasks.add.using(priority=priority)


def test_negative_delay_and_bad_job_ids_are_refused():
    with pytest.raises(ValueError, match="delay must be zero or more"):
        tasks.add.using(delay=-1)
    with pytest.raises(ValueError, match="invalid job id"):
        tasks.add.using(job_id="has space")
    with pytest.raises(ValueError, match="invalid job id"):
        tasks.add.using(job_id="x" * 129)
    with pytest.raises(ValueError, match="invalid queue name"):
        tasks.add.using(queue="{braces}")


def test_payload_limit(settings, redis_client):
    settings.DELAYQ = {**settings.DELAYQ, "MAX_PAYLOAD_BYTES": 100}
    with pytest.raises(PayloadTooLarge, match="over the 100-byte limit"):
        tasks.record.enqueue("x" * 200)
    assert sum(Queue("default").counts().values()) == 0


def test_duplicate_job_id_returns_the_existing_job(redis_client):
    first = tasks.add.using(job_id="once", delay=60).enqueue(1, 2)
    second = tasks.add.using(job_id="once").enqueue(5, 6)
    assert first.created
    assert not second.created
    assert second.status == "scheduled"
    assert Job.fetch("once").args == [1, 2]


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_waits_for_the_commit(redis_client):
    with transaction.atomic():
        tasks.add.enqueue_on_commit(1, 2)
        assert Queue("default").counts()["ready"] == 0
    assert Queue("default").counts()["ready"] == 1
    def enqueue_then_fail() -> None:
        with transaction.atomic():
            tasks.add.enqueue_on_commit(3, 4)
            raise RuntimeError("rolled back")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert Queue("default").counts()["ready"] == 1


def test_enqueue_many_takes_args_kwargs_and_pairs(redis_client):
    result = tasks.add.enqueue_many([[1, 2], {"a": 3, "b": 4}, ([5], {"b": 6})])
    assert (result.enqueued, result.duplicates) == (3, 0)
    assert [Job.fetch(i).args for i in result.job_ids] == [[1, 2], [], [5]]
    with pytest.raises(TypeError, match="missing a required argument"):
        tasks.add.enqueue_many([[1]])


def test_task_decorator_rules():
    with pytest.raises(ValueError, match="not a module-level function"):
        @task
        def local() -> None:  # pragma: no cover - never runs
            pass

    named = task(name="tests.named_local")(lambda: 1)
    assert registry.get("tests.named_local") is named
    registry._tasks.pop("tests.named_local")  # tasks are fixed at start-up: no public way

