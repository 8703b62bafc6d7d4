"""Property-based fuzzing of the REST API against the real test Redis: random bodies,
queue names, job ids and damaged job hashes. Never a 500; a refused request (4xx)
leaves every key as it was; an accepted enqueue makes a job every reader can read."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from hypothesis import example, given
from hypothesis import strategies as st
from rest_framework.test import APIClient

from django_delayq import Job
from django_delayq.connection import get_broker
from django_delayq.engine.fields import STORED
from tests.fuzz.conftest import count_example
from tests.fuzz.test_fuzz_engine import junk, snapshot
from tests.testapp.tasks import record

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(3600)]

API = "/api/delayq"

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**40, 10**40)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)
when = st.one_of(
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.sampled_from(["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-05:00",
                     "1970-01-01T00:00:00Z", "2030-01-01T00:00:00", "soon", ""]),
    json_values,
)
bodies = st.fixed_dictionaries({}, optional={
    "task": st.sampled_from([record.name, "os.system", ""]) | st.text(max_size=10),
    "args": st.lists(json_values, max_size=3) | json_values,
    "kwargs": st.dictionaries(st.sampled_from(["extra", "tag", "x"]), json_values,
                              max_size=2) | json_values,
    "queue": st.sampled_from(["default", "other", "a/b", "", "x" * 70]) | st.text(max_size=8),
    "priority": json_values,
    "delay": json_values | st.sampled_from([1e30, -1.0, 0.5]),
    "run_at": when,
    "job_id": st.sampled_from(["../../x", "a//b", "ok-1", "orders/1"]) | st.text(max_size=12),
    "max_attempts": json_values,
})


@pytest.fixture
def api() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.get_or_create(
        username="fuzz", defaults={"is_superuser": True, "is_staff": True})[0])
    return client


@given(body=bodies)
def test_enqueue_never_500_and_a_refusal_writes_nothing(api, body):
    count_example("api enqueue")
    get_broker().client.flushdb()
    before = snapshot()
    response = api.post(f"{API}/jobs/", body, format="json")
    assert response.status_code < 500, response.content[:500]
    if response.status_code >= 400:
        assert snapshot() == before, f"{response.status_code} but something was written"
        return
    data = response.json()
    job = Job.fetch(data["id"], data["queue"])
    assert job.damaged == {}
    detail = api.get(f"{API}/jobs/{data['queue']}/{quote(data['id'], safe='/')}/")
    assert detail.status_code == 200, detail.content[:300]


@given(action=st.sampled_from(["reschedule", "retry"]), body=bodies)
def test_reschedule_and_retry_never_500_and_a_refusal_changes_nothing(api, action, body):
    count_example(f"api {action}")
    get_broker().client.flushdb()
    job = record.using(delay=3600).enqueue("fz")
    if action == "retry":
        job.cancel()
    before = snapshot()
    response = api.post(f"{API}/jobs/default/{job.id}/{action}/", body, format="json")
    assert response.status_code < 500, response.content[:500]
    if response.status_code >= 400:
        assert snapshot() == before


@given(queue=st.text(max_size=12), job_id=st.text(max_size=20))
@example(queue="0/", job_id="")  # jobs/0/0//: a job id with an empty part was a 500
def test_any_url_is_answered_without_500(api, queue, job_id):
    count_example("api urls")
    for path in (f"/queues/{quote(queue, safe='')}/",
                 f"/jobs/{quote(queue, safe='')}/{quote(job_id, safe='/')}/"):
        response = api.get(API + path)
        assert response.status_code < 500, (path, response.content[:300])


@given(damage=st.dictionaries(st.sampled_from(sorted(STORED.values())), junk, min_size=1,
                              max_size=4))
def test_damaged_hashes_are_shown_not_500(api, damage):
    count_example("api damaged hash")
    get_broker().client.flushdb()
    job = record.using(delay=3600).enqueue("fz")
    key = get_broker().keys_for("default", job.id).job(job.id)
    get_broker().client.hset(key, mapping=damage)
    for path in (f"/jobs/default/{job.id}/", "/queues/", "/queues/default/"):
        response = api.get(API + path)
        assert response.status_code == 200, (path, response.content[:300])
    live = Job.fetch(job.id)
    assert isinstance(live.damaged, dict)
