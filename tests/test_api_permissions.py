"""The API follows Django's model permissions of django_delayq.Job by default: a matrix of
roles over every endpoint, nothing changed when refused, and the setting still overrides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from rest_framework.test import APIClient

from django_delayq import Job, Queue
from tests.testapp.tasks import record

pytestmark = pytest.mark.django_db

API = "/api/delayq"

#: role -> (is_staff, is_superuser, permissions)
ROLES: dict[str, tuple[bool, bool, tuple[str, ...]]] = {
    "anonymous": (False, False, ()),
    "plain user": (False, False, ()),
    "staff, no permissions": (True, False, ()),
    "staff, view_job": (True, False, ("view_job",)),
    "staff, view_job + change_job": (True, False, ("view_job", "change_job")),
    "staff, add_job": (True, False, ("add_job",)),
    "superuser": (True, True, ()),
}

#: Which permission each endpoint needs ("view", "add" or "change"), and how to tell
#: that a write changed something.
Changed = Callable[[dict[str, Job]], bool]
ENDPOINTS: list[tuple[str, str, Any, str, Changed | None]] = [
    ("get", "/", None, "view", None),
    ("get", "/queues/", None, "view", None),
    ("get", "/queues/default/", None, "view", None),
    ("get", "/jobs/", None, "view", None),
    ("get", "/jobs/default/{waiting}/", None, "view", None),
    ("get", "/workers/", None, "view", None),
    ("get", "/schema/", None, "view", None),
    ("get", "/schema/swagger/", None, "view", None),
    ("get", "/schema/redoc/", None, "view", None),
    ("post", "/queues/default/pause/", None, "change",
     lambda jobs: Queue("default").is_paused),
    ("post", "/queues/held/resume/", None, "change",
     lambda jobs: not Queue("held").is_paused),
    ("post", "/jobs/", {"task": record.name, "args": ["new"]}, "add",
     lambda jobs: sum(Queue("default").counts().values()) != 2),
    ("post", "/jobs/default/{waiting}/cancel/", None, "change",
     lambda jobs: jobs["waiting"].refresh().status != "scheduled"),
    ("post", "/jobs/default/{waiting}/abort/", None, "change",
     lambda jobs: jobs["waiting"].refresh().status != "scheduled"),
    ("post", "/jobs/default/{waiting}/reschedule/", {"delay": 0}, "change",
     lambda jobs: jobs["waiting"].refresh().status != "scheduled"),
    ("post", "/jobs/default/{cancelled}/retry/", None, "change",
     lambda jobs: jobs["cancelled"].refresh().status != "cancelled"),
]


def allowed(role: str, needs: str) -> bool:
    _staff, superuser, perms = ROLES[role]
    if superuser:
        return True
    if needs == "view":
        return "view_job" in perms or "change_job" in perms
    return f"{needs}_job" in perms


def client_for(role: str) -> APIClient:
    client = APIClient()
    if role == "anonymous":
        return client
    staff, superuser, perms = ROLES[role]
    user = User.objects.create_user("u", is_staff=staff, is_superuser=superuser)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="django_delayq", codename__in=perms))
    client.force_login(user)
    return client


@pytest.fixture
def jobs() -> dict[str, Job]:
    waiting = record.using(delay=3600).enqueue("waiting")
    cancelled = record.using(delay=3600).enqueue("cancelled")
    cancelled.cancel()
    record.using(queue="held", delay=3600).enqueue("held")  # a queue the API knows,
    Queue("held").pause()  # paused for the resume endpoint to change
    return {"waiting": waiting, "cancelled": cancelled}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("method", "path", "body", "needs", "changed"), ENDPOINTS,
                         ids=[f"{m} {p}" for m, p, *_ in ENDPOINTS])
def test_permission_matrix(jobs, role, method, path, body, needs, changed):
    url = API + path.format(waiting=jobs["waiting"].id, cancelled=jobs["cancelled"].id)
    response = getattr(client_for(role), method)(url, body, format="json")
    if allowed(role, needs):
        assert 200 <= response.status_code < 300, (role, response.content[:300])
        if changed is not None:
            assert changed(jobs), f"{method} {path} as {role} changed nothing"
    else:
        expected = (401, 403) if role == "anonymous" else (403,)
        assert response.status_code in expected, (role, response.content[:300])
        if changed is not None:
            assert not changed(jobs), f"{method} {path} as {role} changed something"


@pytest.mark.parametrize("role", ["staff, add_job", "superuser"])
def test_enqueueing_an_existing_id_shows_the_job_only_to_who_may_read_it(jobs, role):
    """A caller that may add jobs but not read them learns that the id is taken, not the
    arguments, result or error of the job holding it."""
    secret = record.using(job_id="nightly:export", delay=3600).enqueue("a secret token")
    response = client_for(role).post(f"{API}/jobs/", {"task": record.name, "args": ["x"],
                                                      "job_id": secret.id}, format="json")
    assert response.status_code == 200, response.content[:300]
    body = response.json()
    assert (body["id"], body["created"]) == (secret.id, False)
    if role == "superuser":
        assert body["args"] == ["a secret token"]
    else:
        assert body == {"id": secret.id, "queue": "default", "created": False}
        assert "a secret token" not in response.content.decode()


def test_the_setting_still_overrides_the_default(settings):
    settings.DELAYQ = {**settings.DELAYQ, "API_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAdminUser"]}
    assert client_for("staff, no permissions").post(
        f"{API}/queues/default/pause/").status_code == 200
    assert Queue("default").is_paused
