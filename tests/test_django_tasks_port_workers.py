"""The worker cases of the django-tasks backport's own tests, run on delayq: its
database backend's ``db_worker`` tests and its RQ backend's tests
(``tests/tests/test_database_backend.py`` and ``test_rq_backend.py``, shipped up to
django-tasks 0.11, before both backends moved to packages of their own).

Only how the worker runs differs. Where the backport calls ``db_worker --batch`` or an
RQ ``SimpleWorker(burst=True)`` in the test's process, these tests call ``run_jobs``
(``runworker --burst`` in this process, from ``django_delayq.contrib.pytest``); where it
starts ``db_worker`` in a process of its own and signals it, these start ``runworker``.
The tasks are Django tasks enqueued through the Tasks API. Where delayq differs on
purpose, the test says why.

Cases that Django's own tests hold too (exceptions, return values, context, logs,
transactions) are in ``test_django_tasks_port.py``. Not ported: the cases of one storage
(SQL queries counted, row locks, ID functions, migrations, pruning, RQ's connection
settings, ``db_worker --backend``), and task metadata (dropped by django-tasks 0.12;
Django has none).
"""

from __future__ import annotations

import asyncio
import re
import signal
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse
from django.utils import timezone

from django_delayq import Job, Queue
from django_delayq.backends import parse_result_id
from django_delayq.engine import QueueKeys
from django_delayq.engine.errors import LeaseExpired, WorkerLost
from django_delayq.engine.fields import stored
from django_delayq.worker import EXIT_FORCED
from tests.conftest import kill_with_children, wait_until
from tests.testapp import port_tasks as test_tasks
from tests.testapp import standard_tasks as st

try:  # Django 6+
    from django.tasks import TaskResultStatus, default_task_backend
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:  # the django-tasks backport on Django 5.2
    from django_tasks import TaskResultStatus, default_task_backend
    from django_tasks.exceptions import TaskResultDoesNotExist

# An async job checks the connections of sync_to_async's thread, which an earlier test
# may have opened: database access must be allowed.
pytestmark = pytest.mark.django_db(transaction=True)

Spawn = Callable[..., Any]


def job_of(result: Any) -> Job:
    queue, job_id = parse_result_id(result.id)
    assert queue is not None
    return Job.fetch(job_id, queue)


def assert_not_run(result: Any) -> None:
    """What a READY result says before any worker ran it (the RQ tests' checks)."""
    assert result.status == TaskResultStatus.READY
    assert result.is_finished is False
    assert result.started_at is None
    assert result.last_attempted_at is None
    assert result.finished_at is None
    assert result.attempts == 0
    with pytest.raises(ValueError, match="Task has not finished yet"):
        _ = result.return_value


# -- the workers in the test's process ------------------------------------------------


@pytest.mark.parametrize("task", [test_tasks.noop_task, test_tasks.noop_task_async],
                         ids=["sync", "async"])
@pytest.mark.parametrize("enqueue", ["enqueue", "aenqueue"])
def test_enqueue_task(task: Any, enqueue: str) -> None:
    """The RQ tests' ``test_enqueue_task`` and ``test_enqueue_task_async``."""
    if enqueue == "enqueue":
        result = task.enqueue(1, two=3)
        assert (result.args, result.kwargs) == ([1], {"two": 3})
    else:
        result = asyncio.run(task.aenqueue())
        assert (result.args, result.kwargs) == ([], {})
    assert_not_run(result)
    assert result.task == task


def test_run_enqueued_task(run_jobs: Any) -> None:
    result = test_tasks.noop_task.enqueue()
    assert Queue("default").counts()["ready"] == 1
    assert result.status == TaskResultStatus.READY
    assert run_jobs() == 1
    # the caller's result changes only when refreshed
    assert result.status == TaskResultStatus.READY
    assert result.attempts == 0
    result.refresh()
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.started_at >= result.enqueued_at
    assert result.finished_at >= result.started_at
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.attempts == 1
    assert Queue("default").counts()["ready"] == 0


@pytest.mark.parametrize("refresh", ["refresh", "arefresh"])
def test_refresh_result(refresh: str, run_jobs: Any) -> None:
    """The RQ tests' ``test_refresh_result`` and ``test_refresh_result_async``."""
    result = default_task_backend.enqueue(test_tasks.calculate_meaning_of_life, (), {})
    run_jobs()
    assert_not_run(result)
    if refresh == "refresh":
        result.refresh()
    else:
        asyncio.run(result.arefresh())
    assert result.started_at is not None
    assert result.last_attempted_at is not None
    assert result.finished_at is not None
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.is_finished is True
    assert result.return_value == 42
    assert result.attempts == 1


def test_batch_processes_all_tasks(run_jobs: Any) -> None:
    for _ in range(3):
        test_tasks.noop_task.enqueue()
    test_tasks.failing_task_value_error.enqueue()
    assert Queue("default").counts()["ready"] == 4
    assert run_jobs() == 4
    counts = Queue("default").counts()
    assert (counts["ready"], counts["completed"], counts["failed"]) == (0, 3, 1)


def test_no_tasks(run_jobs: Any) -> None:
    assert run_jobs() == 0


def test_doesnt_process_different_queue(run_jobs: Any) -> None:
    result = test_tasks.noop_task.using(queue_name="other").enqueue()
    assert run_jobs(["default"]) == 0
    assert Queue("other").counts()["ready"] == 1
    assert run_jobs([result.task.queue_name]) == 1
    assert Queue("other").counts()["ready"] == 0


def test_process_all_queues(run_jobs: Any, settings: Any) -> None:
    """delayq differs: ``db_worker --queue-name '*'`` serves every queue; a delayq worker
    given no queue names serves the queues its registered tasks name (it waits on each
    queue's own keys, so it must know them), and a queue that only ``using(queue_name=)``
    reaches must be named."""
    settings.TASKS = {"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                                  "QUEUES": []}}
    named = test_tasks.noop_task.using(queue_name="async").enqueue()  # noop_task_async's
    unnamed = test_tasks.noop_task.using(queue_name="queue-1").enqueue()
    assert run_jobs() == 1
    named.refresh()
    assert named.status == TaskResultStatus.SUCCESSFUL
    assert run_jobs(["queue-1"]) == 1
    unnamed.refresh()
    assert unnamed.status == TaskResultStatus.SUCCESSFUL


def test_failing_task(run_jobs: Any) -> None:
    result = test_tasks.failing_task_value_error.enqueue()
    run_jobs()
    assert result.status == TaskResultStatus.READY
    result.refresh()
    assert result.started_at is not None
    assert result.finished_at >= result.started_at >= result.enqueued_at
    assert result.status == TaskResultStatus.FAILED
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    assert result.errors[0].exception_class is ValueError
    assert result.errors[0].traceback.endswith(
        "ValueError: This Task failed due to ValueError\n"), result.errors[0].traceback
    assert result.attempts == 1
    assert Queue("default").counts()["ready"] == 0


def test_run_after(run_jobs: Any) -> None:
    result = test_tasks.noop_task.using(
        run_after=timezone.now() + timezone.timedelta(hours=10)).enqueue()
    assert run_jobs() == 0
    result.refresh()
    assert result.status == TaskResultStatus.READY
    job_of(result).reschedule(run_at=timezone.now())  # the backport updates its row
    assert run_jobs() == 1
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_run_after_priority(run_jobs: Any, redis_client: Any) -> None:
    """Due jobs run by priority, higher first; jobs due later wait.

    delayq differs within one priority: jobs run in the order they became due, which for
    jobs already due when enqueued is the order of their enqueue (the backport orders
    them by ``run_after``: ``very_old`` before ``old``). A job's place in line is set
    once, when it becomes ready, never searched for among older ones."""
    now = timezone.now()
    hours = timezone.timedelta(hours=1)
    record = test_tasks.record_tag
    record.using(priority=20, run_after=now - 2 * hours).enqueue("old")
    record.using(priority=20, run_after=now - 10 * hours).enqueue("very_old")
    record.using(run_after=now + 10 * hours).enqueue("far_future")
    record.using(priority=10, run_after=now + 10 * hours).enqueue("high_priority_far_future")
    record.using(run_after=now + 2 * hours).enqueue("future")
    record.using(priority=10).enqueue("high_priority")
    record.using(priority=2).enqueue("low_priority")
    record.using(priority=-2).enqueue("lower_priority")
    assert run_jobs(concurrency=1) == 5
    assert redis_client.lrange("test:port:ran", 0, -1) == [
        "old", "very_old", "high_priority", "low_priority", "lower_priority"]
    assert Queue("default").counts()["scheduled"] == 3


@pytest.mark.parametrize("task_name", ["subprocess.check_output", "missing.func"])
def test_invalid_task_path(task_name: str, broker: Any, run_jobs: Any) -> None:
    """A job naming a function that is not a registered task fails, and nothing is run:
    the worker looks names up in its registry and never imports them.

    delayq differs for its result: the backport's database backend reads it as FAILED
    and RQ's raises ``SuspiciousOperation``; delayq has no Tasks result for a job that
    is not a Django task, and says so with ``TaskResultDoesNotExist``."""
    sent = broker.enqueue("default", task_name, [["exit", "1"]], max_attempts=1)
    assert run_jobs() == 1
    job = Job.fetch(sent.job_id, "default")
    assert job.status == "failed"
    assert job.error.startswith("django_delayq.engine.errors.UnknownTask"), job.error
    with pytest.raises(TaskResultDoesNotExist, match="not a Django task"):
        default_task_backend.get_result(f"default:{sent.job_id}")


@pytest.mark.parametrize(("task", "exception"), [
    (test_tasks.exit_task, SystemExit),
    (test_tasks.failing_task_keyboard_interrupt, KeyboardInterrupt),
], ids=["exit", "KeyboardInterrupt"])
def test_worker_doesnt_exit(task: Any, exception: type[BaseException], run_jobs: Any) -> None:
    result = task.enqueue()
    after = test_tasks.noop_task.enqueue()
    assert run_jobs() == 2
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is exception
    after.refresh()
    assert after.status == TaskResultStatus.SUCCESSFUL


def test_get_missing_result() -> None:
    for result_id in (str(uuid.uuid4()), "123"):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)
        with pytest.raises(TaskResultDoesNotExist):
            asyncio.run(default_task_backend.aget_result(result_id))


def test_queue_isolation() -> None:
    default_task = test_tasks.noop_task.enqueue()
    other_task = test_tasks.noop_task.using(queue_name="other").enqueue()
    default_task_backend.get_result(default_task.id)
    default_task_backend.get_result(other_task.id)
    assert [job.id for job in Queue("default").jobs("ready")] == [job_of(default_task).id]
    assert [job.id for job in Queue("other").jobs("ready")] == [job_of(other_task).id]


def test_a_failed_result_whose_error_was_lost_still_reads(run_jobs: Any,
                                                            redis_client: Any) -> None:
    """The RQ tests' ``test_exception_classes_pop_empty_list_bug``: a failed job whose
    stored error is missing reads as FAILED with a generic error, not an exception."""
    result = test_tasks.failing_task_value_error.enqueue()
    run_jobs()
    queue, job_id = parse_result_id(result.id)
    assert queue is not None
    redis_client.hdel(QueueKeys("dq", queue).job(job_id), stored("error"), stored("traceback"))
    task_result = default_task_backend.get_result(result.id)
    assert task_result.status == TaskResultStatus.FAILED
    assert task_result.task == test_tasks.failing_task_value_error
    assert task_result.errors[0].exception_class_path == "builtins.Exception"


@pytest.mark.parametrize("url", ["meaning-of-life", "meaning-of-life-async"])
def test_meaning_of_life_view(url: str, client: Any, run_jobs: Any) -> None:
    response = client.get(reverse(url))
    assert response.status_code == 200
    data = response.json()
    assert (data["result"], data["status"]) == (None, TaskResultStatus.READY)
    assert default_task_backend.get_result(data["result_id"]).status == TaskResultStatus.READY
    run_jobs()
    assert default_task_backend.get_result(data["result_id"]).return_value == 42


def test_get_result_from_different_request(client: Any, run_jobs: Any) -> None:
    result_id = client.get(reverse("meaning-of-life")).json()["result_id"]
    response = client.get(reverse("result", args=[result_id]))
    assert response.status_code == 200
    assert response.json() == {"result_id": result_id, "result": None,
                               "status": TaskResultStatus.READY}
    run_jobs()
    assert client.get(reverse("result", args=[result_id])).json() == {
        "result_id": result_id, "result": 42, "status": TaskResultStatus.SUCCESSFUL}
    assert client.get(reverse("result", args=["default:nope"])).status_code == 404


@pytest.mark.parametrize(("args", "message"), [
    (["--name", ""], "--name must not be empty"),
    (["--name", "A" * 201], "--name must be at most 200 characters"),
    (["--name", "two words"], "--name must have no spaces"),
    (["--max-jobs-per-child", "-1"], "--max-jobs-per-child must be at least 1"),
    (["--lease", "inf"], "--lease must be more than 0 (a finite number)"),
    (["--lease", "-1"], "--lease must be more than 0"),
])
def test_bad_worker_options(args: list[str], message: str) -> None:
    """``db_worker``'s tests of its options (an empty or too long worker id, a negative
    or infinite interval, negative max tasks), on ``runworker``'s: refused before any
    worker starts (``--burst``, so that a worker started by mistake ends)."""
    with pytest.raises(CommandError, match=re.escape(message)):
        call_command("runworker", "--burst", "--no-mirror", *args)


# -- runworker in a process of its own ------------------------------------------------


def running(result: Any) -> bool:
    """Refresh ``result``: RUNNING yet? (A job's start is noted with the worker's next
    acks, a moment after its task began.)"""
    result.refresh()
    return result.status == TaskResultStatus.RUNNING


def test_run_subprocess(spawned: Spawn) -> None:
    """The backport's ``test_run_subprocess`` and ``test_verbose_logging``: a burst
    worker runs the task, says so, and exits 0."""
    result = test_tasks.noop_task.enqueue()
    process, out = spawned("default", "--burst", "--name", "port-worker")
    assert process.wait(timeout=60) == 0, out.text
    assert result.status == TaskResultStatus.READY
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    job_id = parse_result_id(result.id)[1]
    lines = out.text.splitlines()
    expected = ["worker started worker=port-worker-0 queues=default",
                f"job completed job={job_id} task={test_tasks.noop_task.module_path}",
                "worker stopped worker=port-worker-0 jobs=1 completed=1"]
    found = [next((i for i, line in enumerate(lines) if text in line), -1) for text in expected]
    assert -1 not in found, out.text
    assert found == sorted(found), out.text
    assert "burst done worker=port-worker-0" in out.text


def test_interrupt_no_tasks(spawned: Spawn) -> None:
    """The backport waits 0.5 s for an idle worker to stop. A busy machine may take
    longer to start or end a Python process, so this waits longer, with the idle wait
    of the worker on Redis set to five minutes: only a stop that wakes it can pass."""
    process, out = spawned("default", env={"DELAYQ_TEST_SETTINGS": '{"BLOCK_TIMEOUT": 300}'})
    out.wait_for("worker started")
    process.terminate()
    assert process.wait(timeout=60) == 0, out.text


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_signals(sig: signal.Signals, spawned: Spawn, redis_client: Any) -> None:
    """A first signal lets the running task finish, then the worker exits 0."""
    result = st.dj_gated.enqueue("gate:signal")
    process, out = spawned("default", "-c", "1")
    wait_until(lambda: running(result), message=f"the task to run:\n{out.text}")
    assert result.worker_ids != []
    process.send_signal(sig)
    out.wait_for("worker stopping")
    assert process.poll() is None, "the worker exited while its task was running"
    redis_client.set("gate:signal", 1)
    assert process.wait(timeout=30) == 0, out.text
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize(("stop", "attempts"), [("second SIGINT", 2), ("second SIGINT", 1),
                                               ("SIGKILL", 1)])
def test_repeat_ctrl_c_and_kill(stop: str, attempts: int, spawned: Spawn, redis_client: Any,
                                settings: Any) -> None:
    """The backport's ``test_repeat_ctrl_c`` and ``test_kill``. delayq differs in both:

    - after a second SIGINT, ``db_worker`` marks the running task FAILED (``SystemExit``)
      and exits 0; ``runworker`` exits at once with 1 (a forced stop), and as its worker
      process ends its host hands the job back at once: with an attempt left
      (``OPTIONS["MAX_ATTEMPTS"]`` above 1) another worker runs it again, else it is
      FAILED with ``WorkerLost``;
    - after SIGKILL (of the host and its worker process: the machine dies),
      ``db_worker``'s task stays RUNNING for ever. On delayq it is RUNNING until its
      lease lapses; then another worker takes it back, FAILED with ``LeaseExpired`` on
      its last attempt.

    No job is lost, or left RUNNING.
    """
    settings.TASKS = {"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                                  "QUEUES": [], "OPTIONS": {"MAX_ATTEMPTS": attempts}}}
    result = st.dj_gated.enqueue("gate:again")
    # A short lease, so that the test need not wait long for it to lapse; not shorter,
    # so that a heartbeat slowed down by a busy machine still renews it in time.
    first, out = spawned("default", "-c", "1", "--lease", "3", "--name", "first")
    # RUNNING comes with the worker's acks, which may land before the task's first line
    # has run: wait for that line too, so that the first run is the one counted below.
    wait_until(lambda: running(result) and redis_client.llen("test:dj") == 1,
               message=f"the task to run:\n{out.text}")
    assert result.worker_ids == ["first-0"]
    if stop == "SIGKILL":
        kill_with_children(first)  # the machine dies: runworker and its worker process
        assert first.returncode == -signal.SIGKILL
        assert running(result), "leased until the lease lapses"
    else:
        first.send_signal(signal.SIGINT)
        out.wait_for("worker stopping")
        assert first.poll() is None, "the first signal waits for the running task"
        assert running(result)
        first.send_signal(signal.SIGINT)
        assert first.wait(timeout=30) == EXIT_FORCED, out.text
        result.refresh()
        assert result.status == (TaskResultStatus.READY if attempts == 2
                                 else TaskResultStatus.FAILED), "handed back at once"
    redis_client.set("gate:again", 1)
    _, out2 = spawned("default", "-c", "1", "--lease", "3", "--name", "second")
    wait_until(lambda: (result.refresh(), result.is_finished)[1], timeout=30,
               message=f"the job to be taken back:\n{out2.text}")
    if attempts == 1:
        assert result.status == TaskResultStatus.FAILED
        lost = WorkerLost if stop == "second SIGINT" else LeaseExpired
        assert result.errors[0].exception_class is lost
        why = "ended while it held the job" if lost is WorkerLost else "stopped renewing"
        assert f"worker first-0 {why}" in result.errors[0].traceback
        assert len(redis_client.lrange("test:dj", 0, -1)) == 1, "it ran once"
    else:
        assert result.status == TaskResultStatus.SUCCESSFUL
        assert result.worker_ids == ["first-0", "second-0"]
        assert result.attempts == 2


@pytest.mark.parametrize(("task", "exception"), [
    (test_tasks.failing_task_system_exit, SystemExit),
    (test_tasks.failing_task_keyboard_interrupt, KeyboardInterrupt),
    (test_tasks.exit_task, SystemExit),
], ids=["SystemExit", "KeyboardInterrupt", "exit"])
def test_system_exit_and_keyboard_interrupt_task(task: Any, exception: type[BaseException],
                                                 spawned: Spawn) -> None:
    result = task.enqueue()
    process, out = spawned("default", "--burst")
    assert process.wait(timeout=60) == 0, out.text
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.errors[0].exception_class is exception


def test_multiple_workers(spawned: Spawn, redis_client: Any) -> None:
    """Three burst workers share the jobs: each job runs once, and each worker ends
    with its burst done."""
    results = [test_tasks.record_tag.enqueue(f"t{i}") for i in range(10)]
    workers = [spawned("default", "--burst") for _ in range(3)]
    for process, out in workers:
        assert process.wait(timeout=60) == 0, out.text
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert sorted(redis_client.lrange("test:port:ran", 0, -1)) == sorted(
        f"t{i}" for i in range(10))
    all_output = "".join(out.text for _, out in workers)
    for _, out in workers:
        assert "burst done" in out.text
    for result in results:
        assert all_output.count(f"job completed job={parse_result_id(result.id)[1]} ") == 1


def test_max_tasks(spawned: Spawn) -> None:
    """``db_worker --max-tasks 2`` becomes ``runworker --max-jobs-per-child 2``.

    delayq differs: its worker process exits after 2 jobs to be replaced ("restart me",
    75), and runworker starts a fresh one and goes on, where ``db_worker`` exits 0 and
    leaves the rest to a process manager."""
    results = [test_tasks.noop_task.enqueue() for _ in range(5)]
    process, out = spawned("default", "-c", "1", "--prefetch", "0",
                           "--max-jobs-per-child", "2")
    for result in results:
        wait_until(lambda result=result: (result.refresh(), result.is_finished)[1],
                   timeout=60, message=f"every task:\n{out.text}")
        assert result.status == TaskResultStatus.SUCCESSFUL
    assert out.text.count("worker-0 exited to be replaced") == 2, out.text
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, out.text
