"""Progress a running job reports: ``current_job().set_progress()``, cheap in a loop,
kept in the job hash, shown by the engine, the API, the mirror and the admin."""

from __future__ import annotations

import math

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from django_delayq import Job as EngineJob
from django_delayq.current import current_job
from django_delayq.engine.progress import ProgressReporter, check_progress
from django_delayq.mirror import Mirror
from django_delayq.models import Job
from tests.conftest import ran, wait_until, worker_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def mirror() -> None:
    Mirror(block=0.1).run(burst=True)


def progress_events(redis_client, job: EngineJob) -> list[dict[str, str]]:
    keys = job._broker.keys_for(job.queue, job.id)
    return [fields for _, fields in redis_client.xrange(keys.events)
            if fields.get("event") == "progress"]


def run(*jobs: EngineJob) -> None:
    with worker_thread(queues=["default"]):
        wait_until(lambda: all(j.refresh().is_finished for j in jobs), message="jobs to finish")


def test_a_loop_of_reports_writes_only_what_changes(redis_client):
    job = tasks.reports_progress.enqueue(20_000, 0.42, "crunching")
    run(job)
    assert job.status == "completed", job.error
    writes = job.result
    # 20,000 calls, 43 whole percents (0..42): at most one write per whole percent,
    # and the last report (deferred by the interval) written when the task returned.
    assert 1 <= writes <= 43
    assert job.progress == pytest.approx(0.42)
    assert job.progress_message == "crunching"
    events = progress_events(redis_client, job)
    assert len(events) in (writes, writes + 1)  # + the flush of a deferred report
    assert events[-1]["gm"] == "crunching"
    assert float(events[-1]["g"]) == pytest.approx(0.42)


def test_progress_of_a_running_job_is_mirrored_and_shown(redis_client, admin_client,
                                                         admin_user):
    job = tasks.progress_then_wait.enqueue(0.25, "a <b>quarter</b>", "gate:progress")
    with worker_thread(queues=["default"]):
        wait_until(lambda: ran(redis_client), message="the task to report")
        # The start is noted with the worker's next acks, a moment after the task began.
        wait_until(lambda: job.refresh().status == "active", message="the job to be active")
        assert (job.progress, job.progress_message) == (0.25, "a <b>quarter</b>")
        mirror()
        row = Job.objects.get(job_id=job.id)
        assert (row.status, row.progress, row.progress_message) == (
            "active", 0.25, "a <b>quarter</b>")
        page = admin_client.get(reverse("admin:django_delayq_job_change", args=[row.pk]))
        html = page.content.decode()
        assert '<progress max="1" value="0.25">25%</progress> 25% — a &lt;b&gt;quarter' in html
        api = APIClient()
        api.force_login(admin_user)
        body = api.get(f"/api/delayq/jobs/default/{job.id}/").json()
        assert body["live"]["progress"] == 0.25
        assert body["live"]["progress_message"] == "a <b>quarter</b>"
        assert body["mirror"]["progress"] == 0.25
        redis_client.set("gate:progress", 1)
        wait_until(lambda: job.refresh().is_finished, message="the job to finish")
    assert job.status == "completed"


def test_progress_event_alone_updates_the_row(redis_client):
    """A job hash gone before the mirror ran: the row takes the event's progress."""
    job = tasks.reports_progress.enqueue(3, 1.0, "done")
    run(job)
    redis_client.delete(job._broker.keys_for(job.queue, job.id).job(job.id))
    mirror()
    row = Job.objects.get(job_id=job.id)
    assert (row.progress, row.progress_message) == (1.0, "done")


@pytest.mark.parametrize("fraction", [-0.1, 1.01, math.nan, math.inf, "0.5", True, None])
def test_a_bad_fraction_fails_the_job_with_a_clear_error(fraction):
    job = tasks.reports_bad_progress.enqueue(fraction) if not isinstance(
        fraction, float) or math.isfinite(fraction) else None
    if job is None:  # NaN and infinity are not JSON: check them directly
        with pytest.raises(ValueError, match="progress must be from 0 to 1"):
            check_progress(fraction, "", 500)
        return
    run(job)
    assert job.status == "failed"
    assert "progress must be" in job.error
    assert job.progress is None


def test_messages_are_checked_and_cut():
    assert check_progress(1, "x" * 2000, 500) == (1.0, "x" * 500)
    assert check_progress(1, "é" * 300, 501) == (1.0, "é" * 250)  # bytes, whole characters
    with pytest.raises(TypeError, match="message must be a str"):
        check_progress(0.5, b"bytes", 500)  # type: ignore[arg-type]


def test_an_attempt_that_lost_its_job_writes_nothing(broker, redis_client):
    job = tasks.record.enqueue("claimed")
    [claimed] = [c for r in broker.claim("default", 1, "w1") for c in r.jobs]
    stale = ProgressReporter(broker, claimed)
    # Another attempt took the job over: the stale reporter's lease token is old.
    redis_client.hset(broker.keys_for("default", job.id).job(job.id), "n", claimed.attempt + 1)
    assert stale.report(0.5, "late") is False
    assert job.refresh().progress is None
    assert progress_events(redis_client, job) == []


def test_outside_a_worker_there_is_no_current_job():
    assert current_job() is None
