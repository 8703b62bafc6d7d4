"""The REST API: permissions, queues, jobs, workers, errors and the OpenAPI schema."""

from __future__ import annotations

import datetime as dt
import importlib
import sys
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from django_delayq import Job, Queue
from django_delayq.mirror import Mirror
from django_delayq.models import Job as MirroredJob
from tests.conftest import round_trips, system_checks, wait_until, worker_thread
from tests.testapp.tasks import always_fails, gated, record

pytestmark = pytest.mark.django_db

API = "/api/delayq"
JOB_PERMISSIONS = ("view_job", "add_job", "change_job")
RECORD = "tests.testapp.tasks.record"


@pytest.fixture
def staff() -> APIClient:
    client = APIClient()
    user = User.objects.create_user("staff", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(
        content_type__app_label="django_delayq", codename__in=JOB_PERMISSIONS))
    client.force_login(user)
    return client


@pytest.fixture
def user() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_user("plain"))
    return client


@pytest.fixture
def anon() -> APIClient:
    return APIClient()


def mirrored(job_id: str, queue: str = "default", **fields: Any) -> MirroredJob:
    """A mirrored row, as the mirror would write it."""
    defaults: dict[str, Any] = {"task_name": RECORD, "status": "completed",
                                "enqueued_at": timezone.now(), "args": ["a"]}
    return MirroredJob.objects.create(job_id=job_id, queue=queue, **{**defaults, **fields})


def later(**kwargs: float) -> dt.datetime:
    return timezone.now() + dt.timedelta(**kwargs)


# -- permissions ---------------------------------------------------------------------

ENDPOINTS = [
    ("get", "/queues/", None),
    ("get", "/queues/default/", None),
    ("post", "/queues/default/pause/", None),
    ("post", "/queues/default/resume/", None),
    ("get", "/jobs/", None),
    ("post", "/jobs/", {"task": RECORD, "args": ["t"]}),
    ("get", "/jobs/default/{waiting}/", None),
    ("post", "/jobs/default/{waiting}/reschedule/", {"delay": 60}),
    ("post", "/jobs/default/{waiting}/cancel/", None),
    ("post", "/jobs/default/{waiting}/abort/", None),
    ("post", "/jobs/default/{cancelled}/retry/", None),
    ("get", "/workers/", None),
    ("get", "/schema/", None),
]


@pytest.fixture
def jobs() -> dict[str, str]:
    waiting = record.using(delay=3600).enqueue("waiting")
    cancelled = record.using(delay=3600).enqueue("cancelled")
    cancelled.cancel()
    return {"waiting": waiting.id, "cancelled": cancelled.id}


def call(client: APIClient, method: str, path: str, body: Any, jobs: dict[str, str]) -> Any:
    return getattr(client, method)(API + path.format(**jobs), body, format="json")


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_anonymous_is_refused(anon: APIClient, jobs: dict[str, str], method: str, path: str,
                              body: Any) -> None:
    response = call(anon, method, path, body, jobs)
    assert response.status_code in (401, 403), response.content
    assert Job.fetch(jobs["waiting"], "default").status == "scheduled"


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_plain_user_is_refused(user: APIClient, jobs: dict[str, str], method: str, path: str,
                               body: Any) -> None:
    response = call(user, method, path, body, jobs)
    assert response.status_code == 403, response.content
    assert not Queue("default").is_paused
    assert Job.fetch(jobs["waiting"], "default").status == "scheduled"


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS)
def test_staff_is_served(staff: APIClient, jobs: dict[str, str], method: str, path: str,
                         body: Any) -> None:
    response = call(staff, method, path, body, jobs)
    assert 200 <= response.status_code < 300, response.content


def test_permission_classes_come_from_settings(settings: Any, user: APIClient,
                                               anon: APIClient) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "API_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated"]}
    assert user.get(f"{API}/queues/").status_code == 200
    assert anon.get(f"{API}/queues/").status_code in (401, 403)


def test_permission_setting_is_checked(settings: Any) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "API_PERMISSION_CLASSES": ["no.such.Permission"]}
    errors = [e for e in system_checks() if e.id == "django_delayq.E040"]
    assert len(errors) == 1
    assert "no.such.Permission" in errors[0].msg
    settings.DELAYQ = {**settings.DELAYQ, "API_PERMISSION_CLASSES": "rest_framework.x"}
    assert [e.id for e in system_checks() if e.id == "django_delayq.E040"] == [
        "django_delayq.E040"]


def test_importing_the_api_without_drf_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "rest_framework", None)
    monkeypatch.delitem(sys.modules, "django_delayq.api")
    with pytest.raises(ImportError, match=r"pip install 'django-delayq\[api\]'"):
        importlib.import_module("django_delayq.api")


# -- queues --------------------------------------------------------------------------


def test_queue_list_has_live_counts(staff: APIClient) -> None:
    record.enqueue("now")
    soon = record.using(delay=600).enqueue("later")
    Queue("default").pause()
    body = staff.get(f"{API}/queues/").json()
    assert (body["count"], body["next"], body["previous"]) == (7, None, None)
    by_name = {q["name"]: q for q in body["results"]}
    assert set(by_name) == {"async", "default", "other", "soak_async", "soak_async_sync",
                            "soak_mixed", "soak_sync"}  # registered tasks' queues
    default = by_name["default"]
    assert default["counts"] == {"waiting": 0, "scheduled": 1, "ready": 1, "active": 0,
                                 "completed": 0, "failed": 0, "cancelled": 0}
    assert default["paused"] is True
    assert dt.datetime.fromisoformat(default["next_due"]) == soon.run_at
    assert by_name["other"]["paused"] is False


def test_queue_list_is_paginated_and_costs_the_round_trips_of_a_few_queues(
        staff: APIClient, broker: Any) -> None:
    record.enqueue("x")
    staff.get(f"{API}/queues/")  # the clock read, sessions warmed
    with round_trips() as few:
        assert staff.get(f"{API}/queues/").json()["count"] == 7
    broker.client.sadd(broker.global_keys.queues, *(f"q{i:04}" for i in range(5_000)))
    with round_trips() as many:
        body = staff.get(f"{API}/queues/").json()
    assert body["count"] == 5_007
    assert len(body["results"]) == 100
    assert body["next"].endswith("/queues/?limit=100&offset=100")
    assert len(few) <= len(many) <= len(few) + 1, (few, many)
    last = staff.get(f"{API}/queues/", {"limit": 1000, "offset": 5_000}).json()
    assert [q["name"] for q in last["results"]] == [
        "q4997", "q4998", "q4999", "soak_async", "soak_async_sync", "soak_mixed", "soak_sync"]
    assert len(staff.get(f"{API}/queues/", {"limit": 5_000}).json()["results"]) == 1_000


def test_queue_detail_pause_and_resume(staff: APIClient) -> None:
    record.enqueue("x")
    detail = staff.get(f"{API}/queues/default/").json()
    assert detail["counts"]["ready"] == 1
    assert RECORD in detail["tasks"]
    assert len(detail["throughput"]) == 60
    assert staff.post(f"{API}/queues/default/pause/").json()["paused"] is True
    assert Queue("default").is_paused
    assert staff.post(f"{API}/queues/default/resume/").json()["paused"] is False
    assert not Queue("default").is_paused


def test_unknown_queues_are_404(staff: APIClient) -> None:
    for path in ("/queues/nope/", "/queues/bad%20name/", "/jobs/nope/some-id/"):
        assert staff.get(API + path).status_code == 404, path
    response = staff.post(f"{API}/queues/nope/pause/")
    assert response.status_code == 404
    assert "nope" in response.json()["detail"]
    assert not Queue("nope").is_paused


# -- job list (mirror) ---------------------------------------------------------------


def test_job_list_filters_and_pages(staff: APIClient) -> None:
    base = timezone.now()
    for i in range(5):
        mirrored(f"d{i}", status="completed", run_at=base + dt.timedelta(minutes=i),
                 enqueued_at=base + dt.timedelta(seconds=i))
    mirrored("o1", queue="other", status="failed", task_name="tests.testapp.tasks.record_other")
    page = staff.get(f"{API}/jobs/", {"limit": 2}).json()
    assert page["count"] == 6
    assert [j["job_id"] for j in page["results"]] == ["d4", "d3"]  # newest first
    assert page["next"]
    assert staff.get(f"{API}/jobs/", {"queue": "other"}).json()["count"] == 1
    assert staff.get(f"{API}/jobs/", {"status": "failed"}).json()["results"][0]["job_id"] == "o1"
    assert staff.get(f"{API}/jobs/", {"task": RECORD}).json()["count"] == 5
    window = {"run_at_after": (base + dt.timedelta(minutes=1)).isoformat(),
              "run_at_before": (base + dt.timedelta(minutes=3)).isoformat()}
    assert {j["job_id"] for j in staff.get(f"{API}/jobs/", window).json()["results"]} == {
        "d1", "d2"}


def test_job_list_and_detail_with_use_tz_off(staff: APIClient) -> None:
    with override_settings(USE_TZ=False, TIME_ZONE="Asia/Kolkata"):
        done = record.enqueue("a")
        with worker_thread(queues=["default"]):
            wait_until(lambda: done.refresh().status == "completed", message="the job to run")
        Mirror(block=0.1).run(burst=True)
        listed = staff.get(f"{API}/jobs/").json()["results"]
        assert [(j["job_id"], j["status"]) for j in listed] == [(done.id, "completed")]
        body = staff.get(f"{API}/jobs/default/{done.id}/").json()
        assert (body["live"]["status"], body["mirror"]["status"]) == ("completed", "completed")
        # every time with its offset: the row's (local, naive in the database) and the
        # live one (read from Redis) say the same instant
        live = dt.datetime.fromisoformat(body["live"]["finished_at"])
        stored = dt.datetime.fromisoformat(body["mirror"]["finished_at"])
        assert live == stored == done.finished_at
        assert body["mirror"]["finished_at"].endswith("+05:30")
        window = {"run_at_after": (done.run_at - dt.timedelta(seconds=1)).isoformat(),
                  "run_at_before": (done.run_at + dt.timedelta(seconds=1)).isoformat()}
        assert [j["job_id"] for j in staff.get(f"{API}/jobs/", window).json()["results"]] == [
            done.id]


@pytest.mark.parametrize("params", [{"status": "bogus"}, {"run_at_after": "2030-01-01T00:00:00"},
                                    {"run_at_before": "tomorrow"}, {"limit": "x"}])
def test_job_list_rejects_bad_filters(staff: APIClient, params: dict[str, str]) -> None:
    response = staff.get(f"{API}/jobs/", params)
    if "limit" in params:  # DRF falls back to the default page size
        assert response.status_code == 200
        return
    assert response.status_code == 400
    assert set(response.json()) == set(params)


# -- job detail and actions ----------------------------------------------------------


def test_job_detail_live_and_mirror(staff: APIClient) -> None:
    job = record.using(delay=60).enqueue("x")
    body = staff.get(f"{API}/jobs/default/{job.id}/").json()
    assert body["live"]["status"] == "scheduled"
    assert body["live"]["args"] == ["x"]
    assert body["live"]["task"] == RECORD
    assert body["position"] == 0
    assert body["mirror"] is None  # not mirrored yet, still found

    mirrored(job.id, status="scheduled")
    body = staff.get(f"{API}/jobs/default/{job.id}/").json()
    assert body["mirror"]["status"] == "scheduled"
    assert body["live"]["id"] == job.id

    mirrored("gone", status="completed", traceback="Traceback ...")
    body = staff.get(f"{API}/jobs/default/gone/").json()
    assert body["live"] is None
    assert body["mirror"]["traceback"] == "Traceback ..."
    assert staff.get(f"{API}/jobs/default/never/").status_code == 404


def test_job_ids_with_slashes_are_addressable(staff: APIClient) -> None:
    job = record.using(job_id="order/42", delay=60).enqueue("x")
    assert staff.get(f"{API}/jobs/default/order/42/").json()["live"]["id"] == job.id
    assert staff.post(f"{API}/jobs/default/order/42/cancel/").json()["status"] == "cancelled"


def test_cancel(staff: APIClient, broker: Any) -> None:
    job = record.using(delay=60).enqueue("x")
    response = staff.post(f"{API}/jobs/default/{job.id}/cancel/")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert Job.fetch(job.id, "default").status == "cancelled"
    assert staff.post(f"{API}/jobs/default/nope/cancel/").status_code == 404

    running = gated.enqueue("g", "gate:api")
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: Job.fetch(running.id, "default").status == "active",
                   message="the gated job to start")
        response = staff.post(f"{API}/jobs/default/{running.id}/cancel/")
        assert response.status_code == 409
        assert "active" in response.json()["detail"]
        live = staff.get(f"{API}/jobs/default/{running.id}/").json()["live"]
        assert live["status"] == "active"
        assert live["started_at"] is not None
        assert live["attempt_log"] == []  # the running attempt is logged once it ends
        broker.client.set("gate:api", "1")
        wait_until(lambda: Job.fetch(running.id, "default").status == "completed",
                   message="the gated job to finish")
    [entry] = staff.get(f"{API}/jobs/default/{running.id}/").json()["live"]["attempt_log"]
    assert (entry["attempt"], entry["outcome"], entry["error"]) == (1, "completed", "")


def test_live_error_is_empty_not_null_as_in_the_mirror(staff: APIClient) -> None:
    job = record.using(delay=60).enqueue("e")
    live = staff.get(f"{API}/jobs/default/{job.id}/").json()["live"]
    assert (live["error"], live["traceback"], live["aborted_by"]) == ("", "", "")


def test_abort_stops_a_running_job_and_names_the_user(staff: APIClient, broker: Any) -> None:
    running = gated.enqueue("g", "gate:never")
    with worker_thread(queues=["default"], concurrency=1, lease=3):
        wait_until(lambda: Job.fetch(running.id, "default").status == "active",
                   message="the gated job to start")
        response = staff.post(f"{API}/jobs/default/{running.id}/abort/")
        assert response.status_code == 200, response.content
        assert response.json()["aborted_by"] == "staff (api)"
        wait_until(lambda: Job.fetch(running.id, "default").status == "cancelled",
                   timeout=60, message="the aborted job to end cancelled")
    live = staff.get(f"{API}/jobs/default/{running.id}/").json()["live"]
    assert live["error"] == "django_delayq.engine.errors.JobAborted: aborted by staff (api)"
    assert [e["outcome"] for e in live["attempt_log"]] == ["aborted"]
    response = staff.post(f"{API}/jobs/default/{running.id}/abort/")
    assert response.status_code == 409
    assert "finished" in response.json()["detail"]


def test_retry(staff: APIClient) -> None:
    job = always_fails.using(max_attempts=1).enqueue("r")
    with worker_thread(queues=["default"], concurrency=1):
        wait_until(lambda: Job.fetch(job.id, "default").status == "failed",
                   message="the job to fail")
    response = staff.post(f"{API}/jobs/default/{job.id}/retry/", {"delay": 3600}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "scheduled"
    assert (response.json()["attempts"], response.json()["max_attempts"]) == (1, 2)
    waiting = record.using(delay=60).enqueue("w")
    response = staff.post(f"{API}/jobs/default/{waiting.id}/retry/", format="json")
    assert response.status_code == 409
    assert staff.post(f"{API}/jobs/default/nope/retry/", format="json").status_code == 404
    bad = staff.post(f"{API}/jobs/default/{job.id}/retry/", {"delay": -1}, format="json")
    assert bad.status_code == 400


def test_reschedule(staff: APIClient) -> None:
    job = record.using(delay=60).enqueue("x")
    when = later(hours=2).replace(microsecond=0)
    url = f"{API}/jobs/default/{job.id}/reschedule/"
    response = staff.post(url, {"run_at": when.isoformat(), "priority": 9}, format="json")
    assert response.status_code == 200, response.content
    fetched = Job.fetch(job.id, "default")
    assert (fetched.run_at, fetched.priority) == (when, 9)
    response = staff.post(url, {"delay": 0}, format="json")
    assert response.json()["status"] == "ready"
    for body, field in [({"run_at": "2030-01-01T09:00:00"}, "run_at"),
                        ({"run_at": "next tuesday"}, "run_at"),
                        ({"delay": "soon"}, "delay"),
                        ({"delay": 5, "run_at": when.isoformat()}, "non_field_errors"),
                        ({}, "non_field_errors"),
                        ({"delay": 5, "priority": 101}, "priority")]:
        response = staff.post(url, body, format="json")
        assert response.status_code == 400, body
        assert field in response.json(), (body, response.json())
    assert Job.fetch(job.id, "default").status == "ready"  # untouched by the bad requests
    assert staff.post(f"{API}/jobs/default/nope/reschedule/", {"delay": 1},
                      format="json").status_code == 404
    Job.fetch(job.id, "default").cancel()
    assert staff.post(url, {"delay": 1}, format="json").status_code == 409


# -- enqueue -------------------------------------------------------------------------


def test_enqueue(staff: APIClient) -> None:
    when = later(hours=1).replace(microsecond=0)
    response = staff.post(f"{API}/jobs/", {
        "task": RECORD, "args": ["api"], "kwargs": {"extra": {"n": 1}}, "priority": 7,
        "run_at": when.isoformat(), "job_id": "api-1"}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["id"], body["created"], body["status"]) == ("api-1", True, "scheduled")
    job = Job.fetch("api-1", "default")
    assert (job.args, job.kwargs, job.priority, job.run_at) == (["api"], {"extra": {"n": 1}},
                                                                7, when)
    again = staff.post(f"{API}/jobs/", {"task": RECORD, "args": ["other"], "job_id": "api-1"},
                       format="json")
    assert again.status_code == 200
    assert again.json()["created"] is False
    assert again.json()["args"] == ["api"]  # the existing job, unchanged

    response = staff.post(f"{API}/jobs/", {"task": "tests.testapp.tasks.record_other",
                                           "args": ["o"], "delay": 30}, format="json")
    assert response.status_code == 201
    assert response.json()["queue"] == "other"


def test_enqueue_into_an_undeclared_queue_is_refused_and_writes_nothing(
        staff: APIClient, settings: Any, redis_client: Any) -> None:
    before = sorted(redis_client.keys("*"))
    response = staff.post(f"{API}/jobs/", {"task": RECORD, "args": ["q"], "queue": "emails"},
                          format="json")
    assert response.status_code == 400, response.content
    (message,) = response.json()["queue"]
    assert "No queue named 'emails' is declared" in message
    assert "API_ANY_QUEUE" in message
    assert sorted(redis_client.keys("*")) == before  # no job, no queue name, no stream
    assert "emails" not in [q["name"] for q in staff.get(f"{API}/queues/").json()["results"]]

    # Declared in QUEUES: accepted.
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"emails": {}}}
    response = staff.post(f"{API}/jobs/", {"task": RECORD, "args": ["q"], "queue": "emails"},
                          format="json")
    assert response.status_code == 201, response.content
    assert Queue("emails").counts()["ready"] == 1

    # Opened by the setting: any valid name.
    settings.DELAYQ = {**settings.DELAYQ, "API_ANY_QUEUE": True}
    response = staff.post(f"{API}/jobs/", {"task": RECORD, "args": ["q"], "queue": "adhoc"},
                          format="json")
    assert response.status_code == 201, response.content
    assert response.json()["queue"] == "adhoc"


@pytest.mark.parametrize(("body", "field", "text"), [
    ({"task": "no.such.task"}, "task", "no.such.task"),
    ({"task": RECORD}, "args", "missing a required argument"),
    ({"task": RECORD, "args": ["a", "b"]}, "args", "too many"),
    ({"task": RECORD, "args": ["a"], "kwargs": {"nope": 1}}, "args", "nope"),
    ({"task": RECORD, "args": "a"}, "args", "list"),
    ({"task": RECORD, "args": ["a"], "kwargs": ["x"]}, "kwargs", "dictionary"),
    ({"task": RECORD, "args": ["a"], "run_at": "2030-01-01T09:00:00"}, "run_at", "time zone"),
    ({"task": RECORD, "args": ["a"], "run_at": "someday"}, "run_at", "ISO 8601"),
    ({"task": RECORD, "args": ["a"], "run_at": 1700000000}, "run_at", "ISO 8601"),
    ({"task": RECORD, "args": ["a"], "delay": -5}, "delay", "0"),
    ({"task": RECORD, "args": ["a"], "delay": 5, "run_at": "2030-01-01T09:00:00Z"},
     "non_field_errors", "not both"),
    ({"task": RECORD, "args": ["a"], "priority": 500}, "priority", "100"),
    ({"task": RECORD, "args": ["a"], "queue": "bad name"}, "queue", "invalid queue name"),
    ({"task": RECORD, "args": ["a"], "job_id": "has space"}, "job_id", "invalid job id"),
    ({"task": RECORD, "args": ["a"], "max_attempts": 0}, "max_attempts", "1"),
])
def test_enqueue_rejects_bad_input(staff: APIClient, body: dict[str, Any], field: str,
                                   text: str) -> None:
    response = staff.post(f"{API}/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert field in errors, errors
    assert text in str(errors[field]), errors
    assert sum(Queue("default").counts().values()) == 0


def test_enqueue_rejects_a_body_that_is_not_an_object(staff: APIClient) -> None:
    response = staff.post(f"{API}/jobs/", [RECORD], format="json")
    assert response.status_code == 400
    assert "non_field_errors" in response.json()
    response = staff.post(f"{API}/jobs/", "{not json", content_type="application/json")
    assert response.status_code == 400


# -- workers -------------------------------------------------------------------------


def test_workers_lists_live_workers(staff: APIClient) -> None:
    assert staff.get(f"{API}/workers/").json() == []
    with worker_thread(queues=["default", "other"], concurrency=2) as worker:
        found = wait_until(lambda: staff.get(f"{API}/workers/").json(),
                           message="the worker to register")
        [entry] = found
        assert entry["name"] == worker.name
        assert entry["queues"] == ["default", "other"]
        assert entry["concurrency"] == 2
        assert entry["heartbeat"]
    assert staff.get(f"{API}/workers/").json() == []


# -- Redis unreachable ---------------------------------------------------------------


@pytest.fixture
def redis_down(settings: Any) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": "redis://127.0.0.1:1/0",
                       "SOCKET_CONNECT_TIMEOUT": 0.5, "SOCKET_TIMEOUT": 0.5}


@pytest.mark.usefixtures("redis_down")
@pytest.mark.parametrize(("method", "path", "body"), [
    ("get", "/queues/", None), ("get", "/queues/default/", None),
    ("post", "/queues/default/pause/", None), ("get", "/jobs/default/x/", None),
    ("post", "/jobs/default/x/cancel/", None), ("post", "/jobs/", {"task": RECORD,
                                                                   "args": ["a"]}),
    ("get", "/workers/", None),
])
def test_redis_unreachable_is_503(staff: APIClient, method: str, path: str, body: Any) -> None:
    response = getattr(staff, method)(API + path, body, format="json")
    assert response.status_code == 503, response.content
    assert "unreachable" in response.json()["detail"]
    assert "127.0.0.1" not in response.content.decode(), "where Redis is: for the log"


@pytest.mark.usefixtures("redis_down")
def test_job_history_needs_no_redis(staff: APIClient) -> None:
    mirrored("old")
    assert staff.get(f"{API}/jobs/").json()["count"] == 1


# -- OpenAPI schema ------------------------------------------------------------------


def test_schema_is_valid_and_lists_every_endpoint(staff: APIClient) -> None:
    from drf_spectacular.drainage import GENERATOR_STATS
    from drf_spectacular.validation import validate_schema

    GENERATOR_STATS.reset()
    response = staff.get(f"{API}/schema/", {"format": "json"})
    assert response.status_code == 200
    schema = response.json()
    assert not GENERATOR_STATS, dict(GENERATOR_STATS._warn_cache)
    validate_schema(schema)
    assert set(schema["paths"]) == {
        f"{API}/queues/", f"{API}/queues/{{queue}}/", f"{API}/queues/{{queue}}/pause/",
        f"{API}/queues/{{queue}}/resume/", f"{API}/jobs/",
        f"{API}/jobs/{{queue}}/{{job_id}}/", f"{API}/jobs/{{queue}}/{{job_id}}/cancel/",
        f"{API}/jobs/{{queue}}/{{job_id}}/abort/", f"{API}/jobs/{{queue}}/{{job_id}}/retry/",
        f"{API}/jobs/{{queue}}/{{job_id}}/reschedule/", f"{API}/workers/",
    }
    paths = schema["paths"]
    enqueue = paths[f"{API}/jobs/"]["post"]
    assert enqueue["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/Enqueue")
    assert set(enqueue["responses"]) >= {"200", "201", "400", "403", "503"}
    arguments = schema["components"]["schemas"]["Enqueue"]["properties"]
    assert (arguments["args"]["type"], arguments["kwargs"]["type"]) == ("array", "object")
    listing = paths[f"{API}/jobs/"]["get"]
    assert {p["name"] for p in listing["parameters"]} >= {
        "queue", "status", "task", "run_at_after", "run_at_before", "limit", "offset"}
    page = listing["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    page_schema = schema["components"]["schemas"][page.rsplit("/", 1)[1]]
    assert {"count", "next", "previous", "results"} <= set(page_schema["properties"])
    assert schema["components"]["schemas"]["JobStatusEnum"]["enum"] == [
        "waiting", "scheduled", "ready", "claimed", "active", "completed", "failed", "cancelled"]
    assert "409" in paths[f"{API}/jobs/{{queue}}/{{job_id}}/cancel/"]["post"]["responses"]
    for path, operations in paths.items():
        for method, operation in operations.items():
            ok = {code for code in operation["responses"] if code.startswith("2")}
            assert ok, (path, method)
            for code in ok:
                assert operation["responses"][code].get("content"), (path, method, code)


def test_schema_is_staff_only(user: APIClient) -> None:
    assert user.get(f"{API}/schema/").status_code == 403
