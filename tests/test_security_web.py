"""Who may change jobs over the web: one matrix over every state-changing API endpoint
and admin action (Django's model permissions, nothing changed when refused), CSRF on
session-authenticated writes, and no Redis password on any page or API answer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from django_delayq import Job, Queue
from django_delayq.mirror import Mirror
from django_delayq.models import Job as Row
from django_delayq.testing import RedisServer
from tests.testapp.tasks import record

pytestmark = pytest.mark.django_db

API = "/api/delayq"
CHANGELIST = "admin:django_delayq_job_changelist"
PASSWORD = "s3cret-web-pw"


@pytest.fixture
def jobs() -> dict[str, Job]:
    waiting = record.using(delay=3600).enqueue("waiting")
    cancelled = record.using(delay=3600).enqueue("cancelled")
    cancelled.cancel()
    for job in (waiting, cancelled):  # the rows the mirror would write
        Row.objects.create(queue="default", job_id=job.id, task_name=record.name,
                           status=job.refresh().status)
    return {"waiting": waiting, "cancelled": cancelled}


def status(job: Job) -> str:
    return job.refresh().status


def admin_action(action: str, which: str) -> Callable[[Client, dict[str, Job]], Any]:
    def run(client: Client, jobs: dict[str, Job]) -> Any:
        pk = Row.objects.get(job_id=jobs[which].id).pk
        return client.post(reverse(CHANGELIST), {"action": action, "_selected_action": [pk]})
    return run


def post(path: str, body: Any = None) -> Callable[[Client, dict[str, Job]], Any]:
    def run(client: Client, jobs: dict[str, Job]) -> Any:
        url = path.format(waiting=jobs["waiting"].id, cancelled=jobs["cancelled"].id)
        return client.post(url, body or {}, content_type="application/json")
    return run


def control(operation: str, body: dict[str, str] | None = None) -> Callable[..., Any]:
    def run(client: Client, jobs: dict[str, Job]) -> Any:
        url = reverse("admin:django_delayq_queue_control", args=["default", operation])
        return client.post(url, body or {})
    return run


#: (name, surface, the request, did it change something?)
OPERATIONS: list[tuple[str, str, Callable[..., Any], Callable[[dict[str, Job]], bool]]] = [
    ("api pause", "api", post(f"{API}/queues/default/pause/"),
     lambda jobs: Queue("default").is_paused),
    ("api enqueue", "api", post(f"{API}/jobs/", {"task": record.name, "args": ["new"]}),
     lambda jobs: sum(Queue("default").counts().values()) != 2),
    ("api cancel", "api", post(f"{API}/jobs/default/{{waiting}}/cancel/"),
     lambda jobs: status(jobs["waiting"]) != "scheduled"),
    ("api reschedule", "api", post(f"{API}/jobs/default/{{waiting}}/reschedule/", {"delay": 0}),
     lambda jobs: status(jobs["waiting"]) != "scheduled"),
    ("api retry", "api", post(f"{API}/jobs/default/{{cancelled}}/retry/"),
     lambda jobs: status(jobs["cancelled"]) != "cancelled"),
    ("admin cancel", "admin", admin_action("cancel_jobs", "waiting"),
     lambda jobs: status(jobs["waiting"]) != "scheduled"),
    ("admin run now", "admin", admin_action("run_jobs_now", "waiting"),
     lambda jobs: status(jobs["waiting"]) != "scheduled"),
    ("admin retry", "admin", admin_action("retry_jobs", "cancelled"),
     lambda jobs: status(jobs["cancelled"]) != "cancelled"),
    ("admin pause", "admin", control("pause"), lambda jobs: Queue("default").is_paused),
    ("admin purge", "admin purge", control("purge", {"confirm": "yes"}),
     lambda jobs: sum(Queue("default").counts().values()) != 2),
]

#: Role -> surfaces it may change things through, by default.
ROLES = {
    "anonymous": set(),
    "active user": set(),
    "staff, no permissions": set(),
    "staff, view_job": set(),
    "staff, view_job + add_job + change_job": {"api", "admin"},
    # purging deletes jobs: Django's delete permission too
    "staff, view_job + add_job + change_job + delete_job": {"api", "admin", "admin purge"},
    "superuser": {"api", "admin", "admin purge"},
}


def client_for(role: str, **kwargs: Any) -> Client:
    client = Client(**kwargs)
    if role == "anonymous":
        return client
    user = User.objects.create_user("u", is_staff=role != "active user",
                                    is_superuser=role == "superuser")
    perms = {"staff, view_job": ["view_job"],
             "staff, view_job + add_job + change_job": ["view_job", "add_job", "change_job"],
             "staff, view_job + add_job + change_job + delete_job": [
                 "view_job", "add_job", "change_job", "delete_job"],
             }.get(role, [])
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    client.force_login(user)
    return client


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("name", "surface", "request_", "changed"), OPERATIONS,
                         ids=[op[0] for op in OPERATIONS])
def test_permission_matrix(jobs, role, name, surface, request_, changed):
    response = request_(client_for(role), jobs)
    if surface in ROLES[role]:
        assert response.status_code < 400, response.content[:300]
        assert changed(jobs), f"{name} as {role} should have worked"
    else:
        assert response.status_code in (200, 302, 401, 403), response.content[:300]
        assert not changed(jobs), f"{name} as {role} changed something"


@pytest.mark.parametrize(("name", "surface", "request_", "changed"), OPERATIONS,
                         ids=[op[0] for op in OPERATIONS])
def test_writes_without_a_csrf_token_are_refused(jobs, name, surface, request_, changed):
    client = client_for("superuser", enforce_csrf_checks=True)
    response = request_(client, jobs)
    assert response.status_code == 403, response.content[:300]
    assert "CSRF" in response.content.decode()
    assert not changed(jobs)


def test_a_task_name_full_of_markup_is_escaped_in_the_admin(admin_client, broker):
    xss = "<img src=x onerror=alert(1)>"
    broker.enqueue("default", f"evil.{xss}", ["a"], delay=3600)
    Mirror(block=0.1).run(burst=True)
    pk = Row.objects.get().pk
    for url in (reverse(CHANGELIST), reverse("admin:django_delayq_job_change", args=[pk])):
        page = admin_client.get(url).content.decode()
        assert xss not in page
        assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_no_page_or_api_answer_shows_the_redis_password(admin_client, settings):
    with RedisServer(extra_args=("--requirepass", PASSWORD)) as server:
        settings.DELAYQ = {**settings.DELAYQ, "SOCKET_TIMEOUT": 0.5,
                           "SOCKET_CONNECT_TIMEOUT": 0.5,
                           "REDIS_URL": f"redis://:{PASSWORD}@127.0.0.1:{server.port}/0"}
        job = record.using(delay=3600).enqueue("secret")
        Mirror(block=0.1).run(burst=True)
        pk = Row.objects.get(job_id=job.id).pk
        pages = {
            "dashboard": reverse("admin:django_delayq_queues"),
            "job list": reverse(CHANGELIST),
            "job page": reverse("admin:django_delayq_job_change", args=[pk]),
            "api queues": f"{API}/queues/",
            "api job": f"{API}/jobs/default/{job.id}/",
            "api workers": f"{API}/workers/",
        }
        up = {name: admin_client.get(url) for name, url in pages.items()}
        server.stop()
        down = {name: admin_client.get(url) for name, url in pages.items()}
        down["admin action"] = admin_client.post(
            reverse(CHANGELIST), {"action": "cancel_jobs", "_selected_action": [pk]},
            follow=True)
        down["api pause"] = admin_client.post(f"{API}/queues/default/pause/")
    assert down["api queues"].status_code == 503
    for name, response in {**up, **down}.items():
        assert response.status_code < 500 or response.status_code == 503, name
        assert PASSWORD not in response.content.decode(), name


def test_a_key_redis_refuses_to_read_is_a_503_or_a_message_never_a_500(admin_client, broker):
    """Another site sharing Redis (or a hand) wrote a key of the wrong type: every page,
    API answer and action that meets it says so, with Redis's words in the log only."""
    job = record.using(delay=3600).enqueue("x")
    Mirror(block=0.1).run(burst=True)
    keys = broker.keys_for("default", job.id)
    broker.client.delete(keys.job(job.id))
    broker.client.set(keys.job(job.id), "not a hash")
    for action in ("cancel", "retry", "abort"):
        response = admin_client.post(f"{API}/jobs/default/{job.id}/{action}/", {},
                                     content_type="application/json")
        assert response.status_code == 503, (action, response.content)
        assert "WRONGTYPE" not in response.json()["detail"]
    row = Row.objects.get(job_id=job.id)
    page = admin_client.post(reverse("admin:django_delayq_job_act", args=[row.pk, "cancel"]),
                             follow=True)
    assert page.status_code == 200
    broker.client.delete(keys.scheduled)
    broker.client.set(keys.scheduled, "not a set")
    assert admin_client.get(f"{API}/queues/").status_code == 503
    assert admin_client.get(f"{API}/queues/default/").status_code == 503
    assert admin_client.get("/metrics/delayq/").status_code == 503


def test_a_row_id_no_database_holds_is_ignored_by_the_live_view(admin_client):
    live = reverse("admin:django_delayq_job_live")
    for pk in ("²", "٣", "9" * 40, "-1", "x"):
        response = admin_client.get(live, {"pk": pk, "live": "1"})
        assert response.status_code == 200, pk
    assert admin_client.get(reverse("admin:django_delayq_queues_data"), {"page": "²"}
                            ).status_code == 200
