"""Every state a job goes through, seen the same way by every view of it: ``Job`` (Redis),
the Django Tasks backend's ``TaskResult``, the mirrored ``Job`` row, and the API's job
detail (its live part and its mirrored part)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from django_delayq import Job
from django_delayq.backends import parse_result_id
from django_delayq.mirror import Mirror
from django_delayq.models import Job as Row
from tests.conftest import wait_until, worker_thread
from tests.testapp import standard_tasks as st

try:
    from django.tasks import task_backends
except ImportError:
    from django_tasks import task_backends

pytestmark = pytest.mark.django_db

#: A Job status, and what the Tasks backend says of it.
TASKS_STATUS = {"scheduled": "READY", "ready": "READY", "claimed": "READY",
                "active": "RUNNING", "completed": "SUCCESSFUL", "failed": "FAILED",
                "cancelled": "FAILED"}


def views(result: Any, client: Any) -> dict[str, tuple[str, bool]]:
    """Each view's status of ``result``'s job and whether it has a start time, once the
    mirror has caught up."""
    queue, job_id = parse_result_id(result.id)
    Mirror(block=0.1).run(burst=True, timeout=30)
    live = Job.fetch(job_id, queue)
    task_result = task_backends["default"].get_result(result.id)
    row = Row.objects.get(queue=queue, job_id=job_id)
    body = client.get(f"/api/delayq/jobs/{queue}/{job_id}/").json()
    return {
        "Job": (live.status, live.started_at is not None),
        "TaskResult": (str(task_result.status), task_result.started_at is not None),
        "row": (row.status, row.started_at is not None),
        "API live": (body["live"]["status"], body["live"]["started_at"] is not None),
        "API mirror": (body["mirror"]["status"], body["mirror"]["started_at"] is not None),
    }


def expected(status: str, *, started: bool) -> dict[str, tuple[str, bool]]:
    return {"Job": (status, started), "TaskResult": (TASKS_STATUS[status], started),
            "row": (status, started), "API live": (status, started),
            "API mirror": (status, started)}


def status_of(result: Any) -> str:
    queue, job_id = parse_result_id(result.id)
    return Job.fetch(job_id, queue).status


def test_every_state_reads_the_same_in_every_view(settings: Any, admin_client: Any,
                                                  broker: Any) -> None:
    settings.TASKS = {"default": {"BACKEND": "django_delayq.backends.DelayQBackend",
                                  "QUEUES": [], "OPTIONS": {"MAX_ATTEMPTS": 2}}}
    # retries wait an hour: the test moves them on itself
    settings.DELAYQ = {**settings.DELAYQ, "RETRY_BACKOFF": 3600, "RETRY_BACKOFF_MAX": 3600}
    client = broker.client
    later = timezone.now() + dt.timedelta(hours=1)
    steps = st.dj_steps.using(run_after=later).enqueue("gate:steps")
    queue, job_id = parse_result_id(steps.id)
    assert views(steps, admin_client) == expected("scheduled", started=False)

    Job.fetch(job_id, queue).reschedule(delay=0)
    assert views(steps, admin_client) == expected("ready", started=False)

    # one thread, busy with a job of higher priority: ``steps`` waits in the buffer
    blocker = st.dj_gated.using(priority=10).enqueue("gate:blocker")
    with worker_thread(queues=["default"], concurrency=1, prefetch=1):
        wait_until(lambda: status_of(blocker) == "active" and status_of(steps) == "claimed",
                   message="the blocker running, the job in the buffer")
        assert views(steps, admin_client) == expected("claimed", started=False)

        client.set("gate:blocker", 1)
        wait_until(lambda: status_of(steps) == "active", message="the first attempt")
        assert views(steps, admin_client) == expected("active", started=True)

        client.set("gate:steps:1", 1)  # the first attempt fails: a retry, an hour later
        wait_until(lambda: status_of(steps) == "scheduled", message="the retry")
        assert views(steps, admin_client) == expected("scheduled", started=True)
        assert Job.fetch(job_id, queue).attempt_log[-1]["outcome"] == "retried"
        steps.refresh()
        assert [e.exception_class_path for e in steps.errors] == ["builtins.ValueError"]

        Job.fetch(job_id, queue).reschedule(delay=0)
        wait_until(lambda: status_of(steps) == "active", message="the second attempt")
        assert views(steps, admin_client) == expected("active", started=True)
        client.set("gate:steps:2", 1)
        wait_until(lambda: status_of(steps) == "completed", message="the second attempt's end")
        assert views(steps, admin_client) == expected("completed", started=True)
        assert task_backends["default"].get_result(steps.id).return_value == "done"

        fails = st.dj_fails.enqueue("f")
        fails_queue, fails_id = parse_result_id(fails.id)
        wait_until(lambda: status_of(fails) == "scheduled", message="its first failure")
        Job.fetch(fails_id, fails_queue).reschedule(delay=0)
        wait_until(lambda: status_of(fails) == "failed", message="its last failure")
        assert views(fails, admin_client) == expected("failed", started=True)

    cancelled = st.dj_add.using(run_after=later).enqueue(1, 2)
    cancelled_queue, cancelled_id = parse_result_id(cancelled.id)
    assert Job.fetch(cancelled_id, cancelled_queue).cancel()
    assert views(cancelled, admin_client) == expected("cancelled", started=False)
