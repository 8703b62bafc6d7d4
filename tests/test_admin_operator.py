"""The operator's admin: buttons that fit the job's status, exact times, readable list
columns, attempts, the dashboard's JSON, warnings, periodic schedules and index link."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone

from django_delayq import task
from django_delayq.models import Job
from django_delayq.task import registry
from tests.conftest import wait_until, worker_thread
from tests.test_admin import change_url, mirror, run_to_end, staff
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

DASHBOARD = "admin:django_delayq_queues"
DATA = "admin:django_delayq_queues_data"
MS_TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} "


def buttons(page: str) -> set[str]:
    return set(re.findall(r'class="button dq-act-([a-z-]+)"', page))


def test_job_page_offers_only_what_applies_to_the_status(admin_client):
    done = tasks.record.enqueue("done")
    failed = tasks.always_fails.using(max_attempts=1).enqueue("failed")
    waiting = tasks.record.using(delay=3600).enqueue("waiting")
    run_to_end(done, failed)
    mirror()
    pages = {job.status: admin_client.get(change_url(job.id)).content.decode()
             for job in (done, failed, waiting)}
    assert buttons(pages["completed"]) == set()
    assert buttons(pages["failed"]) == {"retry", "run-now"}
    assert buttons(pages["scheduled"]) == {"cancel", "run-now"}
    for page in pages.values():
        assert "/history/" not in page  # the change log of a read-only page is empty


def test_job_page_times_have_milliseconds_and_the_zone(admin_client):
    job = tasks.record.enqueue("t")
    run_to_end(job)
    mirror()
    page = admin_client.get(change_url(job.id)).content.decode()
    assert len(re.findall(MS_TIME + "UTC", page)) >= 4  # enqueued, run at, started, finished
    with override_settings(TIME_ZONE="Asia/Kolkata"):
        page = admin_client.get(change_url(job.id)).content.decode()
    local = timezone.localtime(job.started_at, timezone=__import__("zoneinfo").ZoneInfo(
        "Asia/Kolkata"))
    assert f"{local:%Y-%m-%d %H:%M:%S}.{local.microsecond // 1000:03d} IST" in page


def test_job_page_shows_the_attempts(admin_client):
    failed = tasks.always_fails.enqueue("three")  # max_attempts=3
    run_to_end(failed)
    mirror()
    page = admin_client.get(change_url(failed.id)).content.decode()
    assert "Each attempt" in page
    assert page.count('<td class="dq-error-cell">builtins.RuntimeError: boom three</td>') == 3
    assert page.count("<td>retried</td>") == 2
    assert page.count("<td>failed</td>") == 1
    # Each failed attempt's own traceback, folded in its row.
    folded = re.findall(r'<td class="dq-tb-cell"><details class="dq-tb"><summary>traceback'
                        r'</summary><pre class="dq-pre">(.*?)</pre></details></td>', page, re.S)
    assert len(folded) == 3
    assert all(tb.startswith("Traceback (most recent call last):") for tb in folded)
    assert all(tb.endswith("RuntimeError: boom three\n") for tb in folded)
    assert all("t" in entry for entry in Job.objects.get(job_id=failed.id).attempt_log)


def test_api_job_detail_shows_each_attempts_traceback(admin_client):
    failed = tasks.always_fails.using(max_attempts=2).enqueue("api tb")
    done = tasks.record.enqueue("api ok")
    run_to_end(failed, done)
    mirror()
    detail = admin_client.get(f"/api/delayq/jobs/default/{failed.id}/").json()
    for log in (detail["live"]["attempt_log"], detail["mirror"]["attempt_log"]):
        assert [(e["attempt"], e["outcome"]) for e in log] == [(1, "retried"), (2, "failed")]
        assert all(e["traceback"].endswith("RuntimeError: boom api tb\n") for e in log)
        assert all(e["started_at"] and e["finished_at"] for e in log)
    assert detail["live"]["attempt_log"] == detail["mirror"]["attempt_log"]
    [entry] = admin_client.get(f"/api/delayq/jobs/default/{done.id}/").json()["mirror"][
        "attempt_log"]
    assert (entry["outcome"], entry["traceback"]) == ("completed", "")


def test_job_list_columns_and_readable_periodic_ids(admin_client):
    failed = tasks.always_fails.using(max_attempts=1).enqueue("list", )
    done = tasks.record.enqueue("args-shown", extra={"k": 1})
    run_to_end(failed, done)
    mirror()
    Job.objects.create(job_id="cron:shop.tasks.heartbeat:1795456640000", queue="default",
                       task_name="shop.tasks.heartbeat", status="scheduled",
                       run_at=timezone.now(), enqueued_at=timezone.now())
    page = admin_client.get(reverse("admin:django_delayq_job_changelist")).content.decode()
    for header in ("duration", "error", "arguments", "attempts", "run at (utc)"):
        assert f">{header.capitalize()}<" in page or f">{header}<" in page.lower(), header
    assert "RuntimeError: boom list" in page
    assert "[&quot;args-shown&quot;] {&quot;extra&quot;: {&quot;k&quot;: 1}}" in page
    assert re.search(r"\d+ ms</td>", page)
    assert 'title="cron:shop.tasks.heartbeat:1795456640000">⟳ heartbeat @ 11-23 17:57:20<' in page
    assert ">cron:shop.tasks.heartbeat:1795456640000<" not in page


@pytest.fixture
def hourly() -> Iterator[object]:
    @task(name="tests.hourly_report", queue="default", every=3600)
    def hourly_report() -> None:
        pass

    yield hourly_report
    registry._tasks.pop("tests.hourly_report", None)


def test_dashboard_lists_periodic_schedules_and_warns(admin_client, hourly):
    """The schedules listed are those a worker runs (recorded in Redis as it schedules),
    not those this web process knows."""
    from django_delayq.connection import get_broker
    from django_delayq.runtime.periodic import schedule_due

    tasks.record.enqueue("waits")
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert "tests.hourly_report" not in page, "no worker runs it yet"
    schedule_due(get_broker(), [hourly], lookahead_ms=1000)  # what a worker's host does
    registry._tasks.pop("tests.hourly_report")  # a web process that never imported it
    page = admin_client.get(reverse(DASHBOARD)).content.decode()
    assert "No worker is running" in page
    assert "No mirror is running: 1 event(s)" in page
    periodic = page[page.index('id="dq-periodic"'):]
    assert "tests.hourly_report" in periodic
    assert "every 3600s" in periodic
    assert re.search(MS_TIME + "UTC</td>", periodic)  # next run
    assert "never" in periodic
    assert 'class="button dq-purge"' in page
    assert "setInterval(refresh, 5000)" in page
    assert "<script src" not in page.split('id="content-main"')[1]  # nothing from a CDN


def test_dashboard_data_feeds_the_refresh(admin_client, client):
    job = tasks.record.enqueue("json")
    run_to_end(job)
    body = admin_client.get(reverse(DATA)).json()
    [default] = [q for q in body["queues"] if q["name"] == "default"]
    assert default["counts"]["completed"] == 1
    assert default["completed_last_hour"] == 1
    assert default["chart"].startswith('<svg class="dq-chart"')
    assert "Start lateness of 1 starts" in default["lateness_chart"]
    assert body["mirror_lag"] > 0
    assert any("No worker" in w for w in body["warnings"])
    client.force_login(staff("nobody"))
    assert client.get(reverse(DATA)).status_code == 403


def test_admin_index_links_the_dashboard(admin_client, client):
    index = admin_client.get(reverse("admin:index")).content.decode()
    link = reverse("admin:django_delayq_queuesdashboard_changelist")
    assert f'href="{link}"' in index
    assert "Queues dashboard" in index
    response = admin_client.get(link)
    assert response.status_code == 302
    assert response["Location"] == reverse(DASHBOARD)
    client.force_login(staff("viewer", "view_job"))
    assert "Queues dashboard" in client.get(reverse("admin:index")).content.decode()
    client.force_login(staff("nobody2"))
    assert client.get(link).status_code == 403


def field_label(page: str, field: str) -> str:
    """The label of a read-only field of a change page."""
    match = re.search(rf'class="form-row field-{field}[^"]*">.*?<label>([^<]*)</label>', page,
                      re.S)
    assert match, field
    return match[1]


def test_job_page_labels_the_live_state_and_the_workflow(admin_client):
    job = tasks.record.using(delay=600).enqueue("labels")
    mirror()
    page = admin_client.get(change_url(job.id)).content.decode()
    assert field_label(page, "live_state") == "Redis now:"
    assert field_label(page, "workflow_display") == "Parents and dependants:"


def chain_of(n: int) -> list[object]:
    """``n`` jobs, each waiting for the one before; the first one an hour away."""
    jobs = [tasks.record.using(delay=3600).enqueue("step 0")]
    for i in range(1, n):
        jobs.append(tasks.record.using(depends_on=[jobs[-1]]).enqueue(f"step {i}"))
    return jobs


def test_job_page_shows_the_workflow_as_a_tree(admin_client):
    j = chain_of(5)
    mirror()
    page = admin_client.get(change_url(j[1].id)).content.decode()
    flow = page[page.index('class="dq-workflow"'):page.index("field-last_event_id")]
    parents = flow[flow.index("dq-tree-parents"):flow.index("dq-tree-children")]
    children = flow[flow.index("dq-tree-children"):]
    assert j[0].id in parents
    assert "dq-status-scheduled" in parents
    # Three levels of dependants, nested, each waiting and linked to its job page.
    positions = [children.index(f">{job.id}</a>") for job in j[2:]]
    assert positions == sorted(positions)
    assert re.search(r"<ul>(<li>.*?<ul>){2}<li>[^<]*<span[^>]*dq-status-waiting", children)
    for job in j[2:]:
        assert f'href="{change_url(job.id)}"' in children
    assert children.count("dq-status-waiting") == 3


def test_api_job_detail_shows_the_workflow_as_a_tree(admin_client):
    j = chain_of(5)
    detail = admin_client.get(f"/api/delayq/jobs/default/{j[4].id}/").json()["workflow"]
    assert (detail["parents_total"], detail["children_total"]) == (1, 0)
    [p3] = detail["parents"]
    [p2] = p3["parents"]
    [p1] = p2["parents"]
    assert [p["job_id"] for p in (p3, p2, p1)] == [j[3].id, j[2].id, j[1].id]
    assert [p["status"] for p in (p3, p2, p1)] == ["waiting"] * 3
    assert (p1["parents"], p1["more"]) == ([], 1)  # j[0], past the third level
    assert p3["task"] == tasks.record.name
    top = admin_client.get(f"/api/delayq/jobs/default/{j[0].id}/").json()["workflow"]
    assert [top["children"][0]["job_id"], top["children"][0]["children"][0]["job_id"]] == [
        j[1].id, j[2].id]
    schema = admin_client.get("/api/delayq/schema/?format=json").json()
    assert "WorkflowParent" in schema["components"]["schemas"]


def test_job_list_warns_when_no_worker_or_mirror_runs(admin_client):
    tasks.record.using(delay=600).enqueue("unseen")
    changelist = reverse("admin:django_delayq_job_changelist")
    page = admin_client.get(changelist).content.decode()
    warnings = page[page.index('id="dq-warnings"'):]
    assert "No worker is running" in warnings
    assert "No mirror is running: 1 event(s)" in warnings
    with worker_thread(queues=["default"]):
        wait_until(lambda: "No worker is running" not in admin_client.get(
            changelist).content.decode(), message="the worker's heartbeat")


def test_job_list_time_column_names_its_zone(admin_client):
    tasks.record.using(delay=600).enqueue("zone")
    mirror()
    changelist = reverse("admin:django_delayq_job_changelist")
    assert ">Run at (UTC)<" in admin_client.get(changelist).content.decode()
    with override_settings(TIME_ZONE="Asia/Kolkata"):
        assert ">Run at (Asia/Kolkata)<" in admin_client.get(changelist).content.decode()


def reads_processed(client) -> int:
    """Network reads the Redis server processed so far: one per round trip of a client."""
    return int(client.info("stats")["total_reads_processed"])


def test_job_list_warnings_take_three_round_trips_whatever_the_queues_and_workers(
        settings, redis_client):
    from django_delayq.admin import dashboard
    from django_delayq.engine.workers import record_alive

    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"wide": {"shards": 4}}}
    from django_delayq.connection import get_broker

    broker = get_broker()
    for i in range(20):
        tasks.record.using(queue=f"q{i}").enqueue("one")
    tasks.record.using(queue="wide", delay=600).enqueue("sharded")
    for i in range(50):
        record_alive(broker, f"w{i}", 60, {"queues": "default"})
    assert dashboard.health_warnings() == [  # connections warm
        "No mirror is running: 21 event(s) are not in the job list yet. The mirror runs "
        "inside runworker (or manage.py delayq_mirror)."]
    before = reads_processed(redis_client)
    dashboard.health_warnings()
    # the queues, a worker alive, the mirror's backlog; and this INFO
    assert reads_processed(redis_client) - before <= 4


@pytest.fixture
def refused_command(request, settings, redis_client) -> Iterator[str]:
    """DELAYQ on a Redis user that may run every command but one (an ACL)."""
    from django_delayq import connection

    command = request.param
    redis_client.acl_setuser("limited", enabled=True, passwords=["+secret-pw"],
                             categories=["+@all"], commands=[f"-{command}"], keys=["*"],
                             channels=["*"])
    url = settings.DELAYQ["REDIS_URL"].replace("redis://", "redis://limited:secret-pw@", 1)
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": url}
    connection.reset()
    try:
        yield command
    finally:
        connection.reset()
        redis_client.acl_deluser("limited")


@pytest.mark.parametrize("refused_command", ["xinfo", "smembers"], indirect=True)
def test_a_redis_refusing_a_read_shows_a_note_not_an_error_page(admin_client, redis_client,
                                                               refused_command):
    """A refusal is not taken for an empty stream (a wrong warning), nor raised (a
    500): the pages say it."""
    redis_client.sadd("dq:queues", "default")
    page = admin_client.get(reverse("admin:django_delayq_job_changelist"))
    assert page.status_code == 200
    note = "Live queue state is unavailable: Redis refused a read (NoPermissionError"
    assert note in page.content.decode()
    dashboard_page = admin_client.get(reverse(DASHBOARD))
    assert dashboard_page.status_code == 200
    assert note in dashboard_page.content.decode()
    data = admin_client.get(reverse(DATA))
    assert data.status_code == 503
    assert data.json()["error"].startswith(note)
    assert "secret-pw" not in data.json()["error"]
