"""The admin in headless Chromium (Debian's /usr/bin/chromium, driven by Playwright).

Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_delayq import Queue
from django_delayq.mirror import Mirror
from django_delayq.models import Job
from tests.conftest import ROOT, wait_until, worker_thread
from tests.services import CHROMIUM
from tests.testapp import tasks

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]
SHOTS = ROOT / "test-artifacts" / "screenshots"
XSS = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"the browser tests need Chromium at {CHROMIUM}: run scripts/system-deps.sh "
                    "(apt-get install chromium)")
    # Playwright's sync API runs an event loop in this thread; the ORM calls of the tests
    # are still plain synchronous calls.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()
    if previous is None:
        os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
    else:
        os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser: Any, live_server: Any, django_user_model: Any, settings: Any) -> Iterator[Any]:
    """A page logged into the admin as a superuser; records every JS dialog."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast
    django_user_model.objects.create_superuser("admin", "admin@example.com", "admin")
    context = browser.new_context(viewport={"width": 1680, "height": 1000})
    tab = context.new_page()
    tab.dialogs = []

    def on_dialog(dialog: Any) -> None:
        tab.dialogs.append(dialog.message)
        dialog.dismiss()

    tab.on("dialog", on_dialog)
    tab.base = live_server.url
    tab.goto(f"{live_server.url}/admin/")
    tab.fill("#id_username", "admin")
    tab.fill("#id_password", "admin")
    tab.click("input[type=submit]")
    tab.wait_for_selector("#site-name")
    assert "Delayed jobs" in tab.content()
    yield tab
    context.close()


def shot(page: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def mirror() -> None:
    Mirror(block=0.1).run(burst=True)


def test_dashboard_pause_and_resume(page):
    done = [tasks.record.enqueue(f"d{i}") for i in range(4)]
    tasks.record.using(delay=600).enqueue("later")
    with worker_thread(queues=["default"], name="browser-worker"):
        wait_until(lambda: all(j.refresh().is_finished for j in done), message="jobs to run")
        page.goto(f"{page.base}/admin/django_delayq/")
        page.click("text=Queues dashboard")
        page.wait_for_selector("#queue-default")
        row = page.locator("#queue-default")
        assert row.locator(".dq-state").inner_text() == "running"
        assert row.locator("td[data-status=completed]").inner_text() == "4"
        assert row.locator(".dq-throughput svg.dq-chart").count() == 1
        assert row.locator(".dq-lateness svg.dq-chart").count() == 1
        assert "browser-worker" in page.locator("#dq-workers").inner_text()
        shot(page, "queues-dashboard")

    row.locator("button.dq-pause").click()
    page.wait_for_selector("#queue-default .dq-paused")
    assert Queue("default").is_paused
    messages = page.locator(".messagelist:not(.dq-warnings)")  # not the dashboard's warnings
    assert "Queue default paused" in messages.inner_text()
    shot(page, "queues-dashboard-paused")
    page.locator("#queue-default button.dq-resume").click()
    page.wait_for_selector("#queue-default .dq-running")
    assert not Queue("default").is_paused


def test_retry_a_failed_job_from_the_job_list(page):
    failed = tasks.always_fails.using(max_attempts=1).enqueue("browser")
    ok = tasks.record.enqueue("fine")
    with worker_thread(queues=["default"]):
        wait_until(lambda: failed.refresh().status == "failed" and ok.refresh().is_finished,
                   message="the job to fail")
    mirror()
    row = Job.objects.get(job_id=failed.id)
    page.goto(f"{page.base}/admin/django_delayq/job/?status=failed")
    assert page.locator("#result_list .dq-status-failed").count() == 1
    page.check(f"input[name=_selected_action][value='{row.pk}']")
    page.select_option("select[name=action]", "retry_jobs")
    shot(page, "job-list-retry")
    page.click("button[name=index]")
    page.wait_for_selector(".messagelist")
    assert f"1 job(s) retried: {failed.id}" in page.locator(
        ".messagelist:not(.dq-warnings)").inner_text()  # not the list's warnings
    assert failed.refresh().status == "ready"
    with worker_thread(queues=["default"]):
        wait_until(lambda: failed.refresh().status == "failed" and failed.attempts == 2,
                   message="the retried job to run again")


def test_script_in_arguments_is_shown_as_text(page):
    job = tasks.record.using(delay=600).enqueue(XSS, extra=XSS)
    mirror()
    page.goto(f"{page.base}/admin/django_delayq/job/")
    page.click(f"text={job.id}")
    page.wait_for_selector("pre.dq-pre")
    assert XSS in page.locator("pre.dq-pre").first.inner_text()
    assert XSS in page.locator("pre.dq-pre").nth(1).inner_text()
    injected = "Array.from(document.scripts).filter(s => s.text.includes('alert(1)')).length"
    assert page.evaluate(injected) == 0
    shot(page, "job-page-escaped")
    page.goto(f"{page.base}/admin/django_delayq/job/?q={job.id}")
    assert page.locator("#result_list").count() == 1
    assert page.dialogs == []
