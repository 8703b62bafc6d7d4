"""The operator's admin in headless Chromium, in a 1,024 px window, with real
``runworker`` processes running the jobs: aborting a running job from its page (sync,
async, and one holding the GIL, through its process's replacement) ends it and the page
shows who aborted it; the job list follows its jobs by itself; the workers table names a
running job. The API's enqueue form, filled and sent by the browser, takes arguments."""


from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from django_delayq import Job as DelayQJob
from django_delayq.mirror import Mirror
from django_delayq.models import Job
from tests.conftest import wait_until
from tests.test_browser import SHOTS, browser, mirror  # noqa: F401 - browser: the fixture
from tests.testapp import tasks

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 1024
#: How far the page, or the job list's own scrolling box, is wider than the window.
WIDER = """Math.max(document.documentElement.scrollWidth - innerWidth,
  ...[...document.querySelectorAll("#changelist .results")].map(
     el => el.scrollWidth - el.clientWidth))"""


@pytest.fixture
def tab(browser: Any, live_server: Any, django_user_model: Any,  # noqa: F811
        settings: Any) -> Iterator[Any]:
    """A 1,024 px tab signed in to the admin as ``admin``; page errors are collected."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    django_user_model.objects.create_superuser("admin", "admin@example.com", "admin")
    context = browser.new_context(viewport={"width": WIDTH, "height": 800})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda exc: page.errors.append(str(exc)))
    page.base = live_server.url
    page.goto(f"{live_server.url}/admin/login/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "admin")
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")
    yield page
    context.close()
    assert page.errors == []


@pytest.fixture
def mirroring() -> Iterator[None]:
    """The mirror running in this process (the workers' own mirrors have no table: the
    tests' database lives here)."""
    consumer = Mirror(block=0.1)
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    yield
    consumer.stop(drain=False)
    thread.join(30)


def shot(page: Any, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def fits(page: Any, name: str) -> None:
    wider = page.evaluate(WIDER)
    if wider > 0:
        shot(page, "too-wide-" + name.replace(" ", "-"))
    assert wider <= 0, f"{name} is {wider} px wider than a {WIDTH} px window"


def job_page(page: Any, job: Any) -> None:
    row = Job.objects.get(job_id=job.id, queue=job.queue)
    page.goto(f"{page.base}/admin/django_delayq/job/{row.pk}/change/")


ABORTED = {
    "sync": (tasks.sleeps, (600,), ("default",), ("--lease", "3")),
    "async": (tasks.async_overrun, ("browser",), (tasks.ASYNC,), ("--lease", "3")),
    "holding-the-gil": (tasks.holds_gil_unlimited, ("browser",), ("default",),
                        ("--lease", "60")),
}


@pytest.mark.parametrize("kind", list(ABORTED))
def test_aborting_a_running_job_from_its_page_ends_it_and_names_who(kind, tab, spawned):
    func, args, queues, options = ABORTED[kind]
    job = func.enqueue(*args)
    _, out = spawned(*queues, "-c", "1", *options)
    wait_until(lambda: job.refresh().status in ("claimed", "active"), timeout=90,
               message=f"the job to start:\n{out.text}")
    mirror()
    job_page(tab, job)
    tab.evaluate("window.dqNotReloaded = true")
    tab.click("button.dq-act-abort")
    tab.wait_for_selector(".messagelist .success")
    assert f"1 job(s) asked to stop: {job.id}" in tab.locator(".messagelist").inner_text()
    wait_until(lambda: job.refresh().status == "cancelled", timeout=120,
               message=f"the aborted job to end:\n{out.text}")
    assert job.aborted_by == "admin (admin)"
    # The page names who asked at once, and reloads by itself once the job ended.
    assert "admin (admin)" in tab.locator("table.dq-live").inner_text()
    tab.wait_for_function("document.querySelector('table.dq-live') && "
                          "document.querySelector('table.dq-live').innerText"
                          ".includes('Cancelled')", timeout=30_000)
    live = tab.locator("table.dq-live").inner_text()
    assert "Cancelled" in live
    assert "JobAborted: aborted by admin (admin)" in live
    # The page's own reload kept the message of the abort.
    assert f"1 job(s) asked to stop: {job.id}" in tab.locator(".messagelist").inner_text()
    assert tab.locator("button.dq-act-abort").count() == 0
    assert tab.locator("button.dq-act-retry").count() == 1
    fits(tab, f"the page of an aborted {kind} job")
    shot(tab, f"job-aborted-{kind}")
    if kind == "holding-the-gil":
        assert "killed and replaced" in job.error
    after = tasks.record.enqueue("after") if queues == ("default",) else \
        tasks.async_add.enqueue(1, 2)
    wait_until(lambda: after.refresh().status == "completed", timeout=90,
               message=f"the worker to go on after the abort:\n{out.text}")


def test_the_job_list_follows_its_jobs_by_itself(tab, spawned, mirroring, redis_client):
    gate = "gate:browser-list"
    jobs = [tasks.progress_then_wait.enqueue(0.5, f"half {i}", gate) for i in range(3)]
    tab.goto(f"{tab.base}/admin/django_delayq/job/")
    wait_until(lambda: Job.objects.filter(job_id__in=[j.id for j in jobs]).count() == 3,
               timeout=30, message="the rows to be mirrored")
    tab.reload()
    tab.evaluate("window.dqNotReloaded = true")
    spawned("default", "-c", "3", "--lease", "3")
    tab.wait_for_function(
        "document.querySelectorAll('#result_list .dq-status-active').length === 3 && "
        "document.querySelectorAll('#result_list .field-progress_column progress').length "
        "=== 3", timeout=90_000)
    text = tab.locator("#result_list").inner_text()
    assert "50%" in text
    worker = tab.locator("#result_list td.field-worker_column").first.inner_text()
    assert worker not in ("", "-")
    assert tab.locator("#result_list td.field-started_column").first.inner_text() != "-"
    fits(tab, "the job list")
    shot(tab, "job-list-live")
    redis_client.set(gate, "1")
    tab.wait_for_function(
        "document.querySelectorAll('#result_list .dq-status-completed').length === 3",
        timeout=90_000)
    assert tab.evaluate("window.dqNotReloaded") is True, "updated in place, not reloaded"


def test_the_workers_table_names_a_running_job(tab, spawned, redis_client):
    job = tasks.gated.enqueue("w", "gate:browser-workers")
    _, out = spawned("default", "-c", "2", "--lease", "3")
    wait_until(lambda: job.refresh().status == "active", timeout=90,
               message=f"the job to start:\n{out.text}")
    tab.goto(f"{tab.base}/admin/django_delayq/job/queues/")
    tab.wait_for_function(
        f"document.querySelector('#dq-workers .dq-running-jobs') && "
        f"[...document.querySelectorAll('#dq-workers .dq-running-jobs a')]"
        f".some(a => a.textContent === {job.id!r})", timeout=60_000)
    fits(tab, "the queues dashboard")
    shot(tab, "workers-running-jobs")
    redis_client.set("gate:browser-workers", "1")


def test_other_pages_fit_a_1024_px_window(tab):
    for i in range(3):
        tasks.take_anything.enqueue("a long argument value " * 8, key="k" * 60, n=i)
    tasks.always_fails.enqueue("x" * 300)
    mirror()
    for name, path in [("the admin index", "/admin/"),
                       ("the app index", "/admin/django_delayq/"),
                       ("the job list", "/admin/django_delayq/job/"),
                       ("the outbox list", "/admin/django_delayq/outboxentry/")]:
        tab.goto(tab.base + path)
        fits(tab, name)


def test_the_api_enqueue_form_takes_arguments_as_a_person_types_them(tab):
    """The browsable API's HTML form, filled and sent by the browser itself."""
    tab.goto(f"{tab.base}/api/delayq/jobs/")
    form = tab.locator("#post-object-form form")
    form.locator("input[name=task]").fill(tasks.record.name)
    form.locator("textarea[name=args]").fill('["typed in a browser"]')
    form.locator("textarea[name=kwargs]").fill('{"extra": {"tags": ["a", "b"]}}')
    form.locator("input[name=job_id]").fill("from-the-browser")
    form.locator("input[name=run_at]").fill("2099-01-31T09:00:00Z")
    form.locator("button[type=submit], .form-actions button").first.click()
    tab.wait_for_selector("text=HTTP 201")
    job = DelayQJob.fetch("from-the-browser", "default")
    assert (job.args, job.kwargs, job.status) == (
        ["typed in a browser"], {"extra": {"tags": ["a", "b"]}}, "scheduled")
    assert job.run_at is not None
    assert job.run_at.year == 2099

    # Text that is not JSON comes back on the form, under its field.
    tab.goto(f"{tab.base}/api/delayq/jobs/")
    form = tab.locator("#post-object-form form")
    form.locator("input[name=task]").fill(tasks.record.name)
    form.locator("textarea[name=args]").fill("['single quotes']")
    form.locator("button[type=submit], .form-actions button").first.click()
    tab.wait_for_selector("text=HTTP 400")
    assert "Not valid JSON" in tab.locator("#post-object-form").inner_text()
