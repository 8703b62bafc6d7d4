"""Jobs waiting for their key's slot and the busiest keys, as the API, the admin and
the metrics show them; the task options, checked before anything is written."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse

from django_delayq.engine.keyed import KeyedOptions
from tests.test_api import API, staff  # noqa: F401  (a fixture)
from tests.test_metrics import scrape, value

pytestmark = pytest.mark.django_db


@pytest.fixture
def parked(broker: Any) -> list[str]:
    """Key A (limit 1): one job claimed, two waiting for its slot; key B: one claimed."""
    ids = [broker.enqueue("default", "tests.testapp.tasks.record", [f"a{i}"],
                          keyed=KeyedOptions("A", 1)).job_id for i in range(3)]
    broker.enqueue("default", "tests.testapp.tasks.record", ["b"], keyed=KeyedOptions("B", 1))
    assert len([j for r in broker.claim("default", 10, "w") for j in r.jobs]) == 2
    return ids


def test_the_api_shows_a_job_waiting_for_its_slot_and_the_busiest_keys(staff, parked):  # noqa: F811
    detail = staff.get(f"{API}/queues/default/").json()
    assert detail["counts"]["ready"] == 2
    assert detail["keys"] == {"active": [{"key": "A", "jobs": 1}, {"key": "B", "jobs": 1}],
                              "waiting": [{"key": "A", "jobs": 2}], "waiting_total": 2}
    job = staff.get(f"{API}/jobs/default/{parked[1]}/").json()["live"]
    assert job["status"] == "ready"
    assert job["concurrency_key"] == "A"
    assert job["waiting_for_slot"] is True


def test_the_dashboard_and_the_job_page_show_the_keys(admin_client, parked):
    page = admin_client.get(reverse("admin:django_delayq_queues")).content.decode()
    assert "Busiest concurrency keys of default" in page
    assert "Waiting for a slot (2 in all)" in page
    from django_delayq.mirror.consumer import refresh_rows
    from django_delayq.models import Job as Row

    refresh_rows("default", [parked[1]])
    row = Row.objects.get(job_id=parked[1])
    page = admin_client.get(reverse("admin:django_delayq_job_change", args=[row.pk]))
    assert "waiting for a slot: the key is at its limit" in page.content.decode()


def test_the_metrics_count_jobs_waiting_for_a_slot_for_the_top_keys(client, parked):
    samples = scrape(client)
    assert value(samples, "delayq_key_waiting_jobs", queue="default", key="") == 2
    assert value(samples, "delayq_key_waiting_jobs", queue="default", key="A") == 2
    assert value(samples, "delayq_key_active_jobs", queue="default", key="B") == 1


def test_options_are_checked_before_anything_is_written(broker):
    from django_delayq import Queue
    from tests.testapp.keyed_tasks import per_tenant

    with pytest.raises(TypeError):
        per_tenant.using(concurrency_key=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dedupe_window"):
        per_tenant.using(dedupe_key="d", dedupe="debounce")
    with pytest.raises(ValueError, match="concurrency_key"):
        per_tenant.using(concurrency_key=lambda tag, *rest: "").enqueue("x:1")
    with pytest.raises(ValueError, match="invalid concurrency_key"):
        per_tenant.using(concurrency_key=lambda tag, *rest: "\n").enqueue("x:1")
    with pytest.raises(ValueError, match="invalid concurrency_key"):
        per_tenant.using(concurrency_key=lambda tag, *rest: "").enqueue_in_transaction("x:1")
    assert sum(Queue("default").counts().values()) == 0
    job = per_tenant.enqueue("A:1")
    assert (job.outcome, job.concurrency_key) == ("created", "A")
