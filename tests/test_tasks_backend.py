"""DelayQBackend: Django's Tasks API enqueuing into delayq and reading results back."""

from __future__ import annotations

import datetime as dt
import json
import sys
import threading
import time
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from django_delayq import Job, Queue, connection
from django_delayq.backends import DelayQBackend, JobCancelled, parse_result_id
from django_delayq.task import registry
from django_delayq.worker import EXIT_RESTART
from tests.conftest import wait_until, worker_thread
from tests.testapp import standard_tasks as st
from tests.testapp.tasks import record

try:
    from django.tasks import TaskResultStatus, default_task_backend, task_backends
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:
    from django_tasks import TaskResultStatus, default_task_backend, task_backends
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist
    from django_tasks.signals import task_enqueued, task_finished, task_started


def finished(result: Any) -> bool:
    result.refresh()
    return result.is_finished


def test_backend_features_and_no_connection_before_use() -> None:
    connection.reset()
    backend = DelayQBackend("x", {"QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 2}})
    backend.validate_task(st.dj_add)
    assert (backend.supports_defer, backend.supports_priority,
            backend.supports_get_result) == (True, True, True)
    assert backend.max_attempts == 2
    assert connection._brokers == {}, "declaring and validating tasks must not connect"
    assert isinstance(task_backends["default"], DelayQBackend)


def test_tasks_are_registered_for_the_worker_under_their_module_path() -> None:
    name = "tests.testapp.standard_tasks.dj_record"
    assert st.dj_record.module_path == name
    assert name in registry
    assert registry.get(name).queue_name == "other"
    assert registry.get(name).func(tag="direct") == "direct"  # the task's own function


def test_enqueue_runs_on_a_worker_and_returns_the_value() -> None:
    seen: list[tuple[str, str]] = []

    def note(signal: str) -> Any:
        def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
            if task_result.task.func is st.dj_add.func:
                seen.append((signal, str(task_result.status)))
        return receiver

    receivers = {task_enqueued: note("enqueued"), task_started: note("started"),
                 task_finished: note("finished")}
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    try:
        result = st.dj_add.enqueue(2, 3)
        assert result.status == TaskResultStatus.READY
        assert parse_result_id(result.id) == ("default", Job.fetch(
            result.id.split(":", 1)[1], "default").id)
        assert result.args == [2, 3]
        assert result.enqueued_at is not None
        with worker_thread(queues=["default"], concurrency=1):
            wait_until(lambda: finished(result), message="dj_add to finish")
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5
    assert result.errors == []
    assert result.started_at is not None
    assert result.finished_at >= result.started_at
    assert result.attempts == 1
    again = st.dj_add.get_result(result.id)  # the same function: no TaskResultMismatch
    assert (again.status, again.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    assert default_task_backend.get_result(result.id).return_value == 5
    assert seen == [("enqueued", "READY"), ("started", "RUNNING"),
                    ("finished", "SUCCESSFUL")]


def test_using_run_after_priority_and_queue_name(broker: Any) -> None:
    later = timezone.now() + dt.timedelta(hours=1)
    deferred = st.dj_add.using(run_after=later, priority=-20).enqueue(1, 1)
    job = Job.fetch(deferred.id.split(":", 1)[1], "default")
    assert job.status == "scheduled"
    assert abs((job.run_at - later).total_seconds()) < 0.01
    assert job.priority == -20
    fetched = st.dj_add.get_result(deferred.id)
    assert fetched.status == TaskResultStatus.READY
    assert fetched.task.run_after == job.run_at
    assert fetched.task.priority == -20

    # Higher priority runs first: enqueue low to high on a single-thread worker.
    low = st.dj_record.using(priority=-50).enqueue("low")
    high = st.dj_record.enqueue("high")  # priority 5 from the decorator
    top = st.dj_record.using(priority=100).enqueue("top")
    assert low.id.startswith("other:")
    other = st.dj_add.using(queue_name="other").enqueue(4, 4)
    assert other.id.startswith("other:")
    with worker_thread(queues=["other"], concurrency=1, prefetch=0):
        wait_until(lambda: all(finished(r) for r in (low, high, top, other)),
                   message="the other queue to drain")
    assert broker.client.lrange("test:dj", 0, -1) == ["top", "high", "low"]
    assert other.return_value == 8


def test_failures_come_back_as_errors() -> None:
    result = st.dj_fails.enqueue("x")
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: finished(result), message="dj_fails to finish")
    assert result.status == TaskResultStatus.FAILED
    [error] = result.errors
    assert error.exception_class_path == "builtins.ValueError"
    assert error.exception_class is ValueError
    assert "bad x" in error.traceback
    assert "Traceback" in error.traceback
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018


@override_settings(TASKS={"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                                      "QUEUES": [], "OPTIONS": {"MAX_ATTEMPTS": 2}}})
def test_max_attempts_option_retries_failures() -> None:
    result = st.dj_fails.enqueue("twice")
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: finished(result), message="dj_fails to use both attempts")
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 2
    assert [e.exception_class for e in result.errors] == [ValueError]


def test_takes_context_gets_the_running_result() -> None:
    result = st.dj_context.enqueue("ctx")
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: finished(result), message="dj_context to finish")
    assert result.return_value == {"id": result.id, "attempt": 1, "tag": "ctx",
                                   "status": "RUNNING"}


def test_running_then_successful(broker: Any) -> None:
    result = st.dj_gated.enqueue("gate:1")
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: broker.client.lrange("test:dj", 0, -1), message="dj_gated start")
        # The start is noted with the worker's next acks, a moment after the task began.
        wait_until(lambda: finished(result) or result.status == TaskResultStatus.RUNNING,
                   message="dj_gated to be RUNNING")
        assert result.status == TaskResultStatus.RUNNING
        assert result.started_at is not None
        assert result.finished_at is None
        assert len(result.worker_ids) == 1
        broker.client.set("gate:1", "1")
        wait_until(lambda: finished(result), message="dj_gated to finish")
    assert json.loads(broker.client.lrange("test:dj", 0, -1)[0]) == {"started": "gate:1"}
    assert result.return_value == "gate:1"


def test_cancelled_job_is_failed_with_a_cancel_error() -> None:
    result = st.dj_add.using(run_after=timezone.now() + dt.timedelta(hours=1)).enqueue(1, 2)
    queue, job_id = parse_result_id(result.id)
    assert Job.fetch(job_id, queue).cancel()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [JobCancelled]


@override_settings(TASKS={"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                                      "QUEUES": [], "OPTIONS": {"MAX_ATTEMPTS": 2}}})
def test_a_job_cancelled_after_a_failed_attempt_says_so() -> None:
    """Cancelled while it waits for its retry, a job keeps its attempt's error, and its
    cancel error does not claim that it never ran."""
    from django.conf import settings

    result = st.dj_fails.enqueue("once")
    queue, job_id = parse_result_id(result.id)
    slow_retry = {**settings.DELAYQ, "RETRY_BACKOFF": 3600, "RETRY_BACKOFF_MAX": 3600}
    with override_settings(DELAYQ=slow_retry), worker_thread(queues=["default"],
                                                             concurrency=1, burst=True):
        wait_until(lambda: Job.fetch(job_id, queue).attempts == 1
                   and Job.fetch(job_id, queue).status == "scheduled",
                   message="the first attempt to fail")
    assert Job.fetch(job_id, queue).cancel()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [ValueError, JobCancelled]
    assert result.errors[1].traceback == "The job was cancelled after 1 attempt(s).\n"


@override_settings(TASKS={
    "default": {"BACKEND": "django_delayq.backends.DelayQBackend", "QUEUES": []},
    "second": {"BACKEND": "django_delayq.backends.DelayQBackend", "QUEUES": []}})
def test_a_result_read_through_a_second_backend_names_that_backend() -> None:
    enqueued = st.dj_add.using(backend="second").enqueue(1, 2)
    read = st.dj_add.using(backend="second").get_result(enqueued.id)
    assert (read.backend, read.task.backend) == ("second", "second")
    read.refresh()
    assert read.task.backend == "second"


def test_eager_mode_leaves_the_tasks_backend_going_to_redis(settings: Any) -> None:
    """docs/testing.md: ``DELAYQ['EAGER']`` runs ``Task.enqueue`` at once, and leaves the
    Tasks backend alone (Django's immediate backend is the framework's way for that)."""
    with override_settings(DELAYQ={**settings.DELAYQ, "EAGER": True}):
        result = st.dj_add.enqueue(1, 2)
        assert result.status == TaskResultStatus.READY
        result.refresh()
        assert result.status == TaskResultStatus.READY
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: finished(result), message="dj_add to run on a worker")
    assert result.return_value == 3


@override_settings(USE_TZ=False, TIME_ZONE="America/New_York")
def test_without_use_tz_a_results_times_are_naive_local_times() -> None:
    """As Django's own backends give them: comparable with ``timezone.now()``."""
    run_after = timezone.now() + dt.timedelta(hours=1)
    result = st.dj_add.using(run_after=run_after).enqueue(1, 2)
    read = st.dj_add.get_result(result.id)
    for got in (result, read):
        assert got.enqueued_at is not None
        assert timezone.is_naive(got.enqueued_at)
        assert got.enqueued_at <= timezone.now()
    assert abs(read.task.run_after - run_after) < dt.timedelta(milliseconds=1)
    with worker_thread(queues=["default"], concurrency=1):
        Job.fetch(parse_result_id(result.id)[1], "default").reschedule(delay=0)
        wait_until(lambda: finished(read), message="dj_add to run")
    assert read.started_at is not None
    assert read.finished_at is not None
    assert timezone.is_naive(read.started_at)
    assert read.enqueued_at <= read.started_at <= read.finished_at <= timezone.now()


def test_unknown_ids_do_not_exist() -> None:
    backend = task_backends["default"]
    for result_id in ("default:nope", "no-such-job", "not a valid id", "bad queue!:x"):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(result_id)
    native = record.enqueue("plain")  # a delayq task, not a Django one
    with pytest.raises(TaskResultDoesNotExist, match="not a Django task"):
        backend.get_result(f"default:{native.id}")


def test_a_task_name_read_from_redis_imports_only_an_installed_app() -> None:
    """Reading a result imports the module its job names when no task of this process
    has that name; a name from Redis must not import just any module (``this`` prints
    on import; a hostile one would run its code)."""
    sys.modules.pop("this", None)
    for name in ("this.anything", "django_delayq_nope.x", "tests.testapp.tasks.record"):
        job = connection.get_broker().enqueue("default", name)
        with pytest.raises(TaskResultDoesNotExist, match="not a Django task"):
            task_backends["default"].get_result(f"default:{job.job_id}")
    assert "this" not in sys.modules


def test_a_bare_job_id_is_looked_up_across_configured_queues() -> None:
    result = st.dj_add.using(queue_name="other").enqueue(1, 1)
    found = task_backends["default"].get_result(parse_result_id(result.id)[1])
    assert found.id == result.id


def test_validate_task_rejects_bad_options() -> None:
    with pytest.raises(InvalidTask, match="aware"):
        st.dj_add.using(run_after=dt.datetime(2030, 1, 1))  # naive
    with pytest.raises(InvalidTask, match="priority"):
        st.dj_add.using(priority=101)
    with pytest.raises(InvalidTask, match="priority"):
        st.dj_add.using(priority=-101)
    with pytest.raises(InvalidTask, match="not valid"):
        st.dj_add.using(queue_name="emails")  # not in TASKS QUEUES
    with pytest.raises(TypeError, match="dj_add"):
        st.dj_add.enqueue(1, 2, 3)
    with pytest.raises(TypeError):
        st.dj_add.enqueue(1, object())  # not JSON
    assert sum(Queue("default").counts().values()) == 0  # the refused calls added nothing


@override_settings(TASKS={"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                                      "QUEUES": []}})
def test_queue_names_must_suit_delayq() -> None:
    assert st.dj_add.using(queue_name="anything-goes").queue_name == "anything-goes"
    with pytest.raises(InvalidTask, match="not valid for django-delayq"):
        st.dj_add.using(queue_name="has space")


def test_backend_system_checks() -> None:
    backend = DelayQBackend("x", {"QUEUES": ["ok", "bad name"],
                                  "OPTIONS": {"MAX_ATTEMPTS": 0, "COLOUR": "red"}})
    messages = [m.msg for m in backend.check()]
    assert {m.id for m in backend.check()} == {"django_delayq.E041"}
    assert len(messages) == 3
    assert any("COLOUR" in m for m in messages)
    assert not list(DelayQBackend("y", {"QUEUES": ["default"]}).check())


@pytest.mark.slow
def test_a_worker_process_runs_django_tasks(spawned: Any) -> None:
    """A ``runworker`` process finds Django tasks by autodiscovering <app>.tasks."""
    result = st.dj_add.enqueue(20, 22)
    proc, out = spawned("default", "--burst")
    assert proc.wait(timeout=60) == 0, out.text
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL, out.text
    assert result.return_value == 42


def finished_signals(task: Any) -> tuple[list[tuple[str, list[str]]], Any]:
    """What ``task_finished`` says of ``task``'s results (a list it fills), and the
    receiver to disconnect."""
    seen: list[tuple[str, list[str]]] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        if task_result.task.func is task.func:
            seen.append((str(task_result.status),
                         [e.exception_class_path for e in task_result.errors]))

    task_finished.connect(receiver)
    return seen, receiver


@pytest.mark.parametrize(("task", "args", "error_class"), [
    (st.dj_exits, [4], "builtins.SystemExit"),
    (st.dj_returns_unjsonable, [], "builtins.TypeError"),
    (st.dj_async_exits, [4], "builtins.SystemExit"),
    (st.dj_async_returns_unjsonable, [], "builtins.TypeError"),
])
def test_task_finished_says_what_the_stored_result_says(task: Any, args: list[Any],
                                                        error_class: str) -> None:
    """A BaseException, and a return value that is not JSON, end FAILED, and the signal
    (sent once the outcome is final) says FAILED too, for sync and async tasks alike."""
    seen, receiver = finished_signals(task)
    try:
        result = task.enqueue(*args)
        with worker_thread(queues=[task.queue_name], concurrency=1):
            wait_until(lambda: finished(result), message="the task to finish")
            wait_until(lambda: seen, message="the signal")
    finally:
        task_finished.disconnect(receiver)
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [error_class]
    assert seen == [("FAILED", [error_class])]


@override_settings(TASKS={"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                                      "QUEUES": [], "OPTIONS": {"MAX_ATTEMPTS": 2}}})
@pytest.mark.parametrize("task", [st.dj_fails, st.dj_async_fails])
def test_task_finished_says_ready_while_a_retry_follows(task: Any) -> None:
    seen, receiver = finished_signals(task)
    try:
        result = task.enqueue("r")
        with worker_thread(queues=[task.queue_name], concurrency=1):
            wait_until(lambda: finished(result), message="both attempts")
            wait_until(lambda: len(seen) == 2, message="both signals")
    finally:
        task_finished.disconnect(receiver)
    assert seen == [("READY", ["builtins.ValueError"]), ("FAILED", ["builtins.ValueError"])]


@pytest.mark.parametrize("task", [st.dj_fails, st.dj_async_fails])
def test_task_finished_of_a_failure_is_sent_while_its_exception_is_handled(task: Any) -> None:
    """Receivers that read ``sys.exc_info()`` (Django's log line of a failed task) see
    what the task raised, for sync and async tasks alike."""
    handled: list[Any] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        if task_result.task.func is task.func:
            handled.append(sys.exc_info()[1])

    task_finished.connect(receiver)
    try:
        result = task.enqueue("seen")
        with worker_thread(queues=[task.queue_name], concurrency=1):
            wait_until(lambda: finished(result) and handled, message="the signal")
    finally:
        task_finished.disconnect(receiver)
    assert [(type(e), str(e)) for e in handled] == [(ValueError, "bad seen")]


@pytest.mark.parametrize("task", [st.dj_blocks_in_c, st.dj_async_blocks])
def test_task_finished_is_sent_for_a_job_failed_at_its_hard_limit(task: Any) -> None:
    """The watchdog fails the job (its thread, or the event loop, is stuck in a lock wait
    that no JobTimeout or cancellation reaches) and sends the signal itself, while the
    job's thread is still stuck."""
    seen, receiver = finished_signals(task)
    worker = None
    try:
        result = task.enqueue()
        with worker_thread(queues=[task.queue_name], concurrency=1, timeout=0.2,
                           timeout_grace=0.3) as worker:
            wait_until(lambda: finished(result), message="the hard limit")
            wait_until(lambda: seen, message="the signal")
    finally:
        task_finished.disconnect(receiver)
        st.UNBLOCK.set()  # and wait for the stuck thread: nothing of it outlives the test
        if worker is not None:
            for thread in [*worker.executor.threads, worker._async._thread]:
                if thread is not None:
                    thread.join(30)
        st.UNBLOCK.clear()
    assert worker.exit_code == EXIT_RESTART
    assert result.status == TaskResultStatus.FAILED
    assert seen == [("FAILED", ["django_delayq.engine.errors.JobTimeout"])]


@pytest.mark.parametrize("task", [st.dj_add, st.dj_async_add])
def test_a_stop_waits_for_a_slow_task_finished_receiver_and_acks_the_job(task: Any) -> None:
    """A receiver still running when the worker stops delays the stop (within the grace
    period); the job's outcome is acked, not left leased to run again."""
    in_receiver = threading.Event()

    def slow(sender: Any, task_result: Any, **kwargs: Any) -> None:
        if task_result.task.func is task.func:
            in_receiver.set()
            time.sleep(2)  # slow work in the receiver, longer than a thread's join

    task_finished.connect(slow)
    try:
        result = task.enqueue(2, 3)
        with worker_thread(queues=[task.queue_name], concurrency=1) as worker:
            assert in_receiver.wait(30), "the receiver was called"
            worker.request_stop()
    finally:
        task_finished.disconnect(slow)
    assert worker.exit_code == 0
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize("task", [st.dj_add, st.dj_async_add])
def test_a_task_finished_receiver_that_exits_loses_no_outcome(task: Any) -> None:
    """A receiver raising SystemExit is logged: the job's outcome is acked all the same,
    its lease let go, and the worker runs the next job."""

    def exits(sender: Any, task_result: Any, **kwargs: Any) -> None:
        if task_result.task.func is task.func:
            raise SystemExit(3)

    task_finished.connect(exits)
    try:
        first, second = task.enqueue(2, 3), task.enqueue(4, 5)
        with worker_thread(queues=[task.queue_name], concurrency=1, prefetch=0) as worker:
            wait_until(lambda: finished(first) and finished(second),
                       message="both jobs acked")
            wait_until(lambda: worker.ledger.held_count == 0, message="no lease left held")
            assert not worker.stopping
    finally:
        task_finished.disconnect(exits)
    assert worker.exit_code == 0
    assert [(r.status, r.return_value) for r in (first, second)] == [
        (TaskResultStatus.SUCCESSFUL, 5), (TaskResultStatus.SUCCESSFUL, 9)]


def test_buffered_results_are_ready_then_running_then_successful(broker: Any) -> None:
    results = [st.dj_gated.enqueue("gate:buf") for _ in range(3)]
    with worker_thread(queues=["default"], concurrency=1, prefetch=2) as worker:
        wait_until(lambda: Queue("default").counts()["active"] == 3, message="3 leased")
        for result in results:
            result.refresh()
        wait_until(lambda: [r.refresh() or r.status for r in results].count(
            TaskResultStatus.RUNNING) == 1, message="one to run")
        statuses = sorted(str(r.status) for r in results)
        assert statuses == ["READY", "READY", "RUNNING"]
        for result in results:
            if result.status == TaskResultStatus.READY:
                assert (result.started_at, result.worker_ids) == (None, [])
            else:
                assert result.started_at is not None
                assert result.worker_ids == [worker.name]
        broker.client.set("gate:buf", "1")
        wait_until(lambda: all(finished(r) for r in results), message="all to finish")
    for result in results:
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.worker_ids == [worker.name]
        assert result.started_at <= result.finished_at


@override_settings(TASKS={"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                                      "QUEUES": [], "OPTIONS": {"MAX_ATTEMPTS": 2}}})
def test_worker_ids_name_the_worker_of_each_attempt() -> None:
    result = st.dj_fails.enqueue("ids")
    queue, job_id = parse_result_id(result.id)
    with worker_thread(queues=["default"], concurrency=1, name="first-worker"):
        wait_until(lambda: len(Job.fetch(job_id, queue).attempt_log) == 1,
                   message="the first attempt")
    with worker_thread(queues=["default"], concurrency=1, name="second-worker"):
        wait_until(lambda: finished(result), message="the second attempt")
    assert result.worker_ids == ["first-worker", "second-worker"]


def test_a_django_task_reports_progress_through_current_job(redis_client) -> None:
    result = st.dj_progress.enqueue("test:progress-gate")
    queue, job_id = parse_result_id(result.id)
    with worker_thread(queues=[queue], concurrency=1):
        # The worker notes a start with its next acks, so the progress can show first.
        wait_until(lambda: (Job.fetch(job_id, queue).status,
                            Job.fetch(job_id, queue).progress) == ("active", 0.5),
                   message="the job to be active with the progress the task reported")
        assert Job.fetch(job_id, queue).progress_message == "half way"
        result.refresh()
        assert result.status == TaskResultStatus.RUNNING
        redis_client.set("test:progress-gate", 1)
        wait_until(lambda: finished(result), message="dj_progress to finish")
    assert result.status == TaskResultStatus.SUCCESSFUL
    job = Job.fetch(job_id, queue)
    assert (job.progress, job.progress_message) == (1.0, "done")
