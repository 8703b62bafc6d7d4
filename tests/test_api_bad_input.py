"""Bodies of the wrong shape sent to the REST API: a 400 that says what is wrong, and
nothing enqueued or changed."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from django_delayq import Job, Queue
from tests.testapp.tasks import record

pytestmark = pytest.mark.django_db

API = "/api/delayq"
JOB_PERMISSIONS = ("view_job", "add_job", "change_job")
RECORD = record.name


@pytest.fixture
def staff() -> APIClient:
    client = APIClient()
    user = User.objects.create_user("staff", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="django_delayq", codename__in=JOB_PERMISSIONS))
    client.force_login(user)
    return client


def nothing_enqueued() -> bool:
    return not any(Queue("default").counts().values())


@pytest.mark.parametrize(("body", "field"), [
    ({"task": "os.system", "args": ["touch /tmp/x"]}, "task"),
    ({"task": "subprocess.call", "args": [["id"]]}, "task"),
    ({"task": ["tests.testapp.tasks.record"], "args": ["a"]}, "task"),
    ({"task": None, "args": ["a"]}, "task"),
    ({"task": RECORD, "args": ["a"], "priority": True}, "priority"),
    ({"task": RECORD, "args": ["a"], "priority": 1.5}, "priority"),
    ({"task": RECORD, "args": ["a"], "delay": "soon"}, "delay"),
    ({"task": RECORD, "args": ["a"], "delay": [1]}, "delay"),
    ({"task": RECORD, "args": {"tag": "a"}}, "args"),
    ({"task": RECORD, "args": ["a"], "kwargs": "extra=1"}, "kwargs"),
    ({"task": RECORD, "args": ["a"], "job_id": "x" * 129}, "job_id"),
    ({"task": RECORD, "args": ["a"], "job_id": "parent:c"}, "job_id"),
    ({"task": RECORD, "args": ["a"], "queue": "q{r}"}, "queue"),
    ({"task": RECORD, "args": ["a"], "max_attempts": [3]}, "max_attempts"),
])
def test_enqueue_bodies_of_the_wrong_shape_are_400(staff, body, field):
    response = staff.post(f"{API}/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert nothing_enqueued()


@pytest.mark.parametrize("raw", [
    b'{"task": "tests.testapp.tasks.record", "args": [NaN]}',
    b'{"task": "tests.testapp.tasks.record", "args": [Infinity]}',
    b'{"task": "tests.testapp.tasks.record", "args": ["a"]',
    b"\xff\xfe not utf-8",
    b"",
    b"null",
    b'"just a string"',
    b"[" * 100_000 + b"]" * 100_000,
])
def test_enqueue_bodies_that_are_not_a_json_object_are_400(staff, raw):
    response = staff.post(f"{API}/jobs/", raw, content_type="application/json")
    assert response.status_code == 400, response.content[:500]
    assert nothing_enqueued()


def test_deeply_nested_arguments_are_400_not_a_crash(staff):
    raw = (b'{"task": "' + RECORD.encode() + b'", "args": '
           + b"[" * 50_000 + b'"leaf"' + b"]" * 50_000 + b"}")
    response = staff.post(f"{API}/jobs/", raw, content_type="application/json")
    assert response.status_code == 400, response.content[:500]
    assert nothing_enqueued()


def test_arguments_over_the_payload_limit_are_400(staff, settings):
    settings.DELAYQ = {**settings.DELAYQ, "MAX_PAYLOAD_BYTES": 1000}
    response = staff.post(f"{API}/jobs/", {"task": RECORD, "args": ["x" * 5000]},
                          format="json")
    assert response.status_code in (400, 413), response.content
    assert "MAX_PAYLOAD_BYTES" in response.content.decode()
    assert nothing_enqueued()


@pytest.mark.parametrize("body", [
    {"delay": "soon"}, {"delay": -1}, {"run_at": "2030-01-01T09:00:00"},
    {"run_at": "2030-01-01T09:00:00Z", "delay": 5}, {"priority": 101}, {"priority": True},
    ["delay", 5], "delay=5",
])
def test_reschedule_bodies_of_the_wrong_shape_are_400(staff, body):
    job = record.using(delay=3600).enqueue("waiting")
    response = staff.post(f"{API}/jobs/default/{job.id}/reschedule/", body, format="json")
    assert response.status_code == 400, response.content
    after = Job.fetch(job.id, "default")
    assert (after.status, after.run_at, after.priority) == ("scheduled", job.run_at, 0)
