"""The model mirror isolates bad entries: one it cannot apply is logged with its stream id
and reason, counted where operators see it, acknowledged and skipped; the rest of the
batch, and every other queue, are mirrored."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.urls import reverse
from rest_framework.test import APIClient

from django_delayq import Queue
from django_delayq.connection import get_broker
from django_delayq.engine.fields import stored
from django_delayq.mirror import GROUP, Mirror
from django_delayq.models import Job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def pending(client: Any, stream: str) -> int:
    return int(client.xpending(stream, GROUP)["pending"])


def shard(queue: str = "default") -> Any:
    return get_broker().shards(queue)[0]


def mirror() -> Mirror:
    m = Mirror(block=0.1)
    m.run(burst=True, timeout=60)
    return m


@pytest.mark.parametrize(("field", "value"), [
    ("run_at", "soon"),
    ("run_at", str(10**30)),
    ("enqueued_at", "-5"),
    ("started_at", "1e400"),
    ("max_attempts", str(10**30)),
    ("attempts", "-3"),
    ("priority", str(10**30)),
])
def test_a_damaged_job_hash_is_mirrored_with_defaults_and_stalls_nothing(redis_client, field,
                                                                         value):
    before = tasks.record.using(delay=3600).enqueue("before")
    bad = tasks.record.using(delay=3600).enqueue("bad")
    redis_client.hset(shard().job(bad.id), stored(field), value)
    other = tasks.record.using(queue="other", delay=3600).enqueue("other")
    mirror()
    rows = dict(Job.objects.values_list("job_id", "status"))
    assert rows == {before.id: "scheduled", bad.id: "scheduled", other.id: "scheduled"}
    assert pending(redis_client, shard().events) == 0
    assert pending(redis_client, shard("other").events) == 0


@pytest.mark.parametrize("fields", [
    {"event": "completed", "job": "far", "ts": str(10**20)},
    {"event": "completed", "job": "before", "ts": "-1"},
])
def test_an_event_with_a_time_out_of_range_is_skipped_and_recorded(redis_client, fields,
                                                                   caplog):
    first = tasks.record.using(delay=3600).enqueue("first")
    entry = redis_client.xadd(shard().events, fields)
    after = tasks.record.using(delay=3600).enqueue("after")
    m = mirror()
    assert m.skipped == 1
    assert set(Job.objects.values_list("job_id", flat=True)) == {first.id, after.id}
    assert pending(redis_client, shard().events) == 0
    count, reasons = Queue("default").skipped_events()
    assert count == 1
    assert f"id={entry}" in reasons[0]
    assert "out of range" in reasons[0]
    assert f"id={entry}" in caplog.text


def test_an_event_that_cannot_be_applied_is_skipped_alone(redis_client, caplog):
    """A rescheduled event of a job whose hash is gone, with a run_at out of range:
    applying it raises; the other jobs of the same batch are still written."""
    good = tasks.record.using(delay=3600).enqueue("good")
    entry = redis_client.xadd(shard().events, {"event": "rescheduled", "job": "gone",
                                               "ts": "1700000000000", "run_at": str(10**30)})
    also = tasks.record.using(delay=3600).enqueue("also")
    m = mirror()
    assert set(Job.objects.values_list("job_id", flat=True)) == {good.id, also.id}
    assert m.skipped == 1
    assert pending(redis_client, shard().events) == 0
    count, reasons = Queue("default").skipped_events()
    assert count == 1
    assert f"id={entry}" in reasons[0]
    assert "job gone" in reasons[0]
    assert "mirror skipped an event it cannot apply" in caplog.text


def test_a_bad_name_in_the_queues_set_hides_no_queue(redis_client, caplog):
    broker = get_broker()
    job = tasks.record.using(delay=3600).enqueue("x")
    redis_client.sadd(broker.global_keys.queues, "bad name/with space", "")
    assert [q.name for q in Queue.all()] == ["default"]
    assert "skipping a bad name in the queues set" in caplog.text
    mirror()
    assert Job.objects.get(job_id=job.id).status == "scheduled"


def test_skipped_events_show_in_the_api_and_on_the_dashboard(redis_client, client):
    tasks.record.using(delay=3600).enqueue("x")
    entry = redis_client.xadd(shard().events, {"event": "completed", "job": "j",
                                               "ts": str(10**20)})
    mirror()
    admin = User.objects.create_superuser("root")
    api = APIClient()
    api.force_login(admin)
    body = api.get("/api/delayq/queues/default/").json()
    assert body["mirror_skipped"]["count"] == 1
    assert f"id={entry}" in body["mirror_skipped"]["last"][0]
    client.force_login(admin)
    page = client.get(reverse("admin:django_delayq_queues")).content.decode()
    assert 'data-skipped="1"' in page
    assert f"id={entry}" in page
