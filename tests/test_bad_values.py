"""Every value is checked before anything is written: a refused call leaves no trace.

Delays, run_at, max_attempts, priorities and job ids, through the Python API, the REST
API, the Tasks backend, ``enqueue_many`` and the Spark path.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import override_settings
from rest_framework.test import APIClient

from django_delayq import Job, Queue
from django_delayq.connection import get_broker
from django_delayq.engine.validation import MAX_ATTEMPTS, MAX_TIME_MS
from django_delayq.task import JobSpec
from tests.testapp.tasks import record

API = "/api/delayq"
RECORD = "tests.testapp.tasks.record"
PLUS_14 = dt.timezone(dt.timedelta(hours=14))
YEAR_1 = dt.datetime(1, 1, 1, tzinfo=PLUS_14)
#: The latest time stored: every time zone can still show it (+14:00 included).
LAST_MS = dt.datetime(9998, 12, 31, tzinfo=dt.UTC)
PAST_LAST = LAST_MS + dt.timedelta(milliseconds=1)


def keys_in_redis() -> list[str]:
    """Every key, the queues set included."""
    return sorted(get_broker().client.scan_iter("*"))


def assert_no_trace() -> None:
    assert keys_in_redis() == []


BAD_OPTIONS: list[tuple[dict[str, Any], str]] = [
    ({"delay": 1e30}, "delay must be zero or more seconds"),
    ({"delay": dt.timedelta(days=365 * 101)}, "delay must be zero or more seconds"),
    ({"delay": -1}, "delay must be zero or more seconds"),
    ({"run_at": YEAR_1}, "out of range"),
    ({"run_at": dt.datetime(1969, 12, 31, tzinfo=dt.UTC)}, "out of range"),
    ({"run_at": PAST_LAST}, "no later than 9998-12-31T00:00:00Z"),
    ({"max_attempts": 10**30}, "max_attempts must be an int from 1"),
    ({"max_attempts": MAX_ATTEMPTS + 1}, "max_attempts must be an int from 1"),
    ({"max_attempts": True}, "max_attempts must be an int from 1"),
    ({"priority": True}, "priority must be an int"),
    ({"job_id": "../../x"}, "may not be empty, '.' or '..'"),
    ({"job_id": "a//b"}, "may not be empty"),
    ({"job_id": "a/."}, "may not be empty"),
    ({"job_id": ".."}, "may not be empty"),
]


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_using_refuses_bad_options_before_anything_is_written(options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        record.using(**options).enqueue("x")
    assert_no_trace()


@pytest.mark.parametrize(("options", "message"), BAD_OPTIONS)
def test_enqueue_many_refuses_a_bad_call_and_sends_nothing_of_its_chunk(options, message):
    with pytest.raises((TypeError, ValueError), match=message):
        record.enqueue_many([JobSpec(("ok",)), JobSpec(("bad",), **options)])
    assert_no_trace()


def test_enqueue_many_on_a_bad_queue_name_remembers_no_queue():
    from django_delayq.engine import EnqueueRequest

    assert get_broker().enqueue_many("no/such queue", []).enqueued == 0
    with pytest.raises(ValueError, match="invalid queue name"):
        get_broker().enqueue_many("no/such queue", [EnqueueRequest(task=RECORD)])
    assert_no_trace()


def test_the_latest_time_stored_round_trips():
    job = record.using(run_at=LAST_MS).enqueue("x")
    assert job.run_at == LAST_MS
    again = Job.fetch(job.id, "default")
    assert again.run_at == LAST_MS
    assert again.damaged == {}
    assert record.using(max_attempts=MAX_ATTEMPTS).enqueue("y").refresh().max_attempts == (
        MAX_ATTEMPTS)
    assert record.using(delay=100 * 365 * 86_400).enqueue("z").refresh().status == "scheduled"
    assert record.using(job_id="orders/42/receipt").enqueue("w").id == "orders/42/receipt"


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"delay": 1e30}, "delay must be zero or more seconds"),
    ({"run_at": YEAR_1}, "out of range"),
    ({"priority": True}, "priority must be an int"),
])
def test_reschedule_and_retry_refuse_bad_times_and_change_nothing(kwargs, message):
    job = record.using(delay=3600).enqueue("x")
    before = get_broker().client.hgetall(f"{{dq:default}}:j:{job.id}")
    with pytest.raises((TypeError, ValueError), match=message):
        job.reschedule(**kwargs)
    cancelled = record.using(delay=3600).enqueue("y")
    cancelled.cancel()
    if "priority" not in kwargs:
        with pytest.raises(ValueError, match=message):
            cancelled.retry(**kwargs)
    assert get_broker().client.hgetall(f"{{dq:default}}:j:{job.id}") == before
    assert Job.fetch(cancelled.id, "default").status == "cancelled"
    assert Queue("default").counts()["scheduled"] == 1


# -- the REST API -----------------------------------------------------------------------


@pytest.fixture
def staff(db: Any) -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_superuser("root"))
    return client


@pytest.mark.parametrize(("body", "field"), [
    ({"delay": True}, "delay"),
    ({"delay": False}, "delay"),
    ({"delay": 1e30}, "delay"),
    ({"run_at": "0001-01-01T00:00:00+14:00"}, "run_at"),
    ({"run_at": "9999-12-31T23:59:59-05:00"}, "run_at"),
    ({"run_at": "9998-12-31T00:00:00.001Z"}, "run_at"),
    ({"max_attempts": 10**30}, "max_attempts"),
    ({"max_attempts": True}, "max_attempts"),
    ({"priority": True}, "priority"),
    ({"job_id": "../../x"}, "job_id"),
])
def test_api_enqueue_refuses_bad_values_with_400_and_writes_nothing(staff, body, field):
    response = staff.post(f"{API}/jobs/", {"task": RECORD, "args": ["t"], **body},
                          format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert_no_trace()


@pytest.mark.parametrize("body", [{"delay": True}, {"delay": 1e30},
                                  {"run_at": "0001-01-01T00:00:00+14:00"}])
def test_api_reschedule_and_retry_refuse_bad_values(staff, body):
    job = record.using(delay=3600).enqueue("x")
    cancelled = record.using(delay=3600).enqueue("y")
    cancelled.cancel()
    response = staff.post(f"{API}/jobs/default/{job.id}/reschedule/", body, format="json")
    assert response.status_code == 400, response.content
    response = staff.post(f"{API}/jobs/default/{cancelled.id}/retry/", body, format="json")
    assert response.status_code == 400, response.content
    assert Job.fetch(job.id, "default").run_at == job.run_at
    assert Job.fetch(cancelled.id, "default").status == "cancelled"


@override_settings(TIME_ZONE="Pacific/Kiritimati")  # +14:00, the zone furthest ahead
def test_a_job_at_the_latest_time_reads_in_every_zone(staff):
    from django.urls import reverse

    from django_delayq.mirror import Mirror
    from django_delayq.models import Job as Row

    job = record.using(run_at=LAST_MS).enqueue("last")
    Mirror(block=0.1).run(burst=True)
    detail = staff.get(f"{API}/jobs/default/{job.id}/")
    assert detail.status_code == 200, detail.content
    assert detail.json()["live"]["run_at"] == "9998-12-31T14:00:00+14:00"
    assert detail.json()["mirror"]["run_at"] == "9998-12-31T14:00:00+14:00"
    assert staff.get(f"{API}/jobs/").status_code == 200
    queue = staff.get(f"{API}/queues/default/")
    assert queue.status_code == 200, queue.content
    assert queue.json()["next_due"] == "9998-12-31T14:00:00+14:00"
    row = Row.objects.get(job_id=job.id)
    page = staff.get(reverse("admin:django_delayq_job_change", args=[row.pk]))
    assert page.status_code == 200
    assert "9998-12-31 14:00:00.000 +14" in page.content.decode()
    changelist = reverse("admin:django_delayq_job_changelist")
    for query in ("", "?run_at__year=9998", "?run_at__year=9998&run_at__month=12",
                  "?run_at__year=9998&run_at__month=12&run_at__day=31"):
        listed = staff.get(changelist + query)
        assert listed.status_code == 200, query
        assert "12-31 14:00:00" in listed.content.decode(), query
    dashboard = staff.get(reverse("admin:django_delayq_queues"))
    assert dashboard.status_code == 200
    assert "9998-12-31 14:00:00" in dashboard.content.decode()
    assert staff.get(reverse("admin:django_delayq_queues_data")).status_code == 200
    with pytest.raises(ValueError, match="out of range"):
        record.using(run_at=PAST_LAST).enqueue("past")
    past = staff.post(f"{API}/jobs/", {"task": RECORD, "args": ["t"],
                                       "run_at": "9998-12-31T14:00:00.001+14:00"},
                      format="json")
    assert past.status_code == 400
    assert "no later than 9998-12-31T00:00:00Z" in str(past.json()["run_at"])


# -- the Tasks backend and the Spark path --------------------------------------------------


def test_tasks_backend_refuses_a_run_after_out_of_range():
    from tests.testapp import standard_tasks as st

    with pytest.raises(ValueError, match="out of range"):
        st.dj_add.using(run_after=YEAR_1).enqueue(1, 2)
    assert_no_trace()


def test_spark_rows_with_times_out_of_range_are_rejected_not_raised():
    from django_delayq.spark.partition import EnqueuePlan, enqueue_partition

    plan = EnqueuePlan(redis_url=os.environ["DELAYQ_TEST_REDIS_URL"], task=RECORD,
                       args=((0, ("plain",), "tag"),), columns=("tag", "when"),
                       run_at_kind="text", run_at_pos=1)
    result = next(enqueue_partition(plan, [("a", "0001-01-01T00:00:00+14:00"),
                                           ("b", "1969-01-01T00:00:00+00:00"),
                                           ("c", "2030-01-01T00:00:00+00:00")]))
    assert (result.enqueued, result.rejected) == (1, 2)
    assert all("out of range" in reason for reason, _ in result.samples)
    micros = EnqueuePlan(redis_url=os.environ["DELAYQ_TEST_REDIS_URL"], task=RECORD,
                         args=((0, ("plain",), "tag"),), columns=("tag", "when"),
                         run_at_kind="micros", run_at_pos=1)
    result = next(enqueue_partition(micros, [("d", 10**30), ("e", (MAX_TIME_MS + 1) * 1000)]))
    assert (result.enqueued, result.rejected) == (0, 2)
