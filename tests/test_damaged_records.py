"""Damaged records in Redis are shown as damaged (which field, what was found) by every
reader, and a job key of the wrong type is failed with a reason, never dropped."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.urls import reverse
from rest_framework.test import APIClient

from django_delayq import Job, Queue
from django_delayq.connection import get_broker
from django_delayq.engine.fields import stored
from django_delayq.engine.workers import record_alive
from django_delayq.mirror import Mirror
from django_delayq.models import Job as MirroredJob
from tests.testapp.tasks import record

pytestmark = pytest.mark.django_db


def keys() -> Any:
    return get_broker().shards("default")[0]


@pytest.fixture
def api() -> APIClient:
    client = APIClient()
    client.force_login(User.objects.create_superuser("root"))
    return client


def damaged_job(field: str, value: str) -> Job:
    job = record.using(delay=3600).enqueue("x")
    get_broker().client.hset(keys().job(job.id), stored(field), value)
    return job


@pytest.mark.parametrize(("field", "value"), [
    ("run_at", "soon"), ("run_at", str(10**30)), ("enqueued_at", "1e400"),
    ("started_at", "-7"), ("max_attempts", str(10**30)), ("priority", "true"),
    ("args", "[1e400]"), ("kwargs", '{"x": NaN}'), ("result", "{broken"),
])
def test_job_queue_and_api_readers_name_the_damaged_field(api, field, value):
    job = damaged_job(field, value)
    assert Job.fetch(job.id).damaged == {field: value}
    listed = Queue("default").jobs("scheduled")
    assert listed[0].damaged == {field: value}
    response = api.get(f"/api/delayq/jobs/default/{job.id}/")
    assert response.status_code == 200, response.content
    assert response.json()["live"]["damaged"] == {field: value}


def test_the_admin_job_page_shows_the_damaged_field(client):
    job = damaged_job("run_at", "soon")
    Mirror(block=0.1).run(burst=True, timeout=30)
    row = MirroredJob.objects.get(job_id=job.id)
    client.force_login(User.objects.create_superuser("root"))
    page = client.get(reverse("admin:django_delayq_job_change", args=[row.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "damaged in Redis" in text
    assert "run_at: &#x27;soon&#x27;" in text
    assert "Redis is unreachable" not in text


def test_a_job_key_of_the_wrong_type_is_read_as_damaged(api):
    job = record.using(delay=3600).enqueue("x")
    client = get_broker().client
    client.delete(keys().job(job.id))
    client.rpush(keys().job(job.id), "not", "a", "hash")
    assert Job.fetch(job.id).damaged == {"record": "a list key, not a hash"}
    assert Queue("default").jobs("scheduled")[0].damaged["record"].startswith("unreadable")
    assert api.get(f"/api/delayq/jobs/default/{job.id}/").status_code == 200


@pytest.mark.parametrize("when", ["ready", "scheduled"])
def test_the_claim_fails_a_job_key_of_the_wrong_type_with_a_reason(when):
    broker = get_broker()
    client = broker.client
    bad = record.enqueue("bad") if when == "ready" else record.using(delay=0.05).enqueue("bad")
    good = record.enqueue("good")
    client.delete(keys().job(bad.id))
    client.rpush(keys().job(bad.id), "junk")
    if when == "scheduled":
        client.zadd(keys().scheduled, {bad.id: 1})  # due at once
    claimed = [j.id for r in broker.claim("default", 10, "w1") for j in r.jobs]
    assert claimed == [good.id]
    assert client.zscore(keys().failed, bad.id) is not None
    for status in ("scheduled", "ready", "active"):
        assert client.zscore(keys().status_set(status), bad.id) is None
    failed = Job.fetch(bad.id)
    assert failed.status == "failed"
    assert "DamagedJob: the job key held a list, not a hash" in failed.error


def test_workers_with_damaged_records_are_listed_with_the_damage(api, client):
    broker = get_broker()
    gk = broker.global_keys
    broker.client.zadd(gk.workers, {"w-bad": broker.server_time_ms()})
    broker.client.hset(gk.worker("w-bad"), mapping={"host": "h", "pid": "1", "started": "x1",
                                                    "heartbeat": str(10**30)})
    response = api.get("/api/delayq/workers/")
    assert response.status_code == 200, response.content
    (worker,) = response.json()
    assert worker["damaged"] == {"started": "x1"}  # the heartbeat is the ZSET score
    client.force_login(User.objects.get(username="root"))
    page = client.get(reverse("admin:django_delayq_queues"))
    assert page.status_code == 200
    assert "damaged started: x1" in page.content.decode()


def test_a_bad_name_in_the_queues_set_breaks_no_reader(api, client):
    record.enqueue("x")
    get_broker().client.sadd(get_broker().global_keys.queues, "no/such queue")
    response = api.get("/api/delayq/queues/")
    assert response.status_code == 200
    assert "default" in [q["name"] for q in response.json()["results"]]
    assert "no/such queue" not in str(response.json())
    client.force_login(User.objects.get(username="root"))
    assert client.get(reverse("admin:django_delayq_queues")).status_code == 200


def test_a_worker_record_of_the_wrong_type_is_skipped_with_one_log_line(api, client, caplog):
    broker = get_broker()
    gk = broker.global_keys
    broker.client.zadd(gk.workers, {"x": broker.server_time_ms()})
    broker.client.set(gk.worker("x"), "junk")
    with caplog.at_level("WARNING", logger="django_delayq"):
        for _ in range(3):
            response = api.get("/api/delayq/workers/")
            assert response.status_code == 200, response.content
            assert response.json() == []
    assert sum("damaged worker record" in r.getMessage() for r in caplog.records) == 1
    client.force_login(User.objects.get(username="root"))
    page = client.get(reverse("admin:django_delayq_queues"))
    assert page.status_code == 200
    assert "Redis is unreachable" not in page.content.decode()
    assert "Live queue state is unavailable" not in page.content.decode()
    out, err = StringIO(), StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("delayq_health", stdout=out, stderr=err)
    assert exited.value.code == 3, (out.getvalue(), err.getvalue())  # no worker, not Redis
    assert "No worker matches" in err.getvalue()
    # Next to a sound worker, the damaged record changes nothing of its health.
    record_alive(broker, "w-ok", 60, {"queues": "default", "threads": 4, "lease": 30})
    call_command("delayq_health", stdout=out, stderr=err)  # exit code 0: returns
    assert "worker w-ok" in out.getvalue()
    assert "UNHEALTHY" not in out.getvalue()
    assert [w["name"] for w in api.get("/api/delayq/workers/").json()] == ["w-ok"]


def test_a_bad_queue_name_is_logged_once_not_on_every_request(api, caplog):
    record.enqueue("x")
    get_broker().client.sadd(get_broker().global_keys.queues, "bad name once")
    with caplog.at_level("WARNING", logger="django_delayq"):
        for _ in range(3):
            assert api.get("/api/delayq/queues/").status_code == 200
    assert sum("bad name" in r.getMessage() for r in caplog.records) == 1
