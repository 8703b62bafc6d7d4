"""Every admin page and every API page in headless Chromium, at 1,366 and 1,920 px, in
light and dark mode: no server error, no console error, no overlapping controls.

Screenshots go to test-artifacts/screenshots/pages/ (one per page, size and scheme).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.urls import reverse

from django_delayq.models import Job
from tests.conftest import ROOT, wait_until, worker_thread
from tests.test_browser import browser, mirror  # noqa: F401 - browser: the fixture
from tests.testapp import tasks

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = ROOT / "test-artifacts" / "screenshots" / "pages"
VIEWS = [("1366-light", 1366, "light"), ("1920-light", 1920, "light"),
         ("1366-dark", 1366, "dark"), ("1920-dark", 1920, "dark")]

#: Groups of controls that sit side by side; none of their controls may overlap.
TOOLBARS = (".object-tools", ".dq-job-actions", ".dq-controls-row", ".submit-row",
            "#changelist .actions", ".breadcrumbs", "#changelist-search",
            ".navbar", ".request-info", ".response-info .meta", "#user-tools")

OVERLAPS = """(selectors) => {
  const found = [];
  for (const bar of document.querySelectorAll(selectors.join(","))) {
    const boxes = [...bar.querySelectorAll("a, button, input[type=submit], select")]
      .filter(el => el.offsetParent !== null)
      .map(el => [el, el.getBoundingClientRect()])
      .filter(([, r]) => r.width > 0 && r.height > 0);
    for (let i = 0; i < boxes.length; i++) {
      for (let j = i + 1; j < boxes.length; j++) {
        const [a, ra] = boxes[i], [b, rb] = boxes[j];
        if (a.contains(b) || b.contains(a)) continue;
        const w = Math.min(ra.right, rb.right) - Math.max(ra.left, rb.left);
        const h = Math.min(ra.bottom, rb.bottom) - Math.max(ra.top, rb.top);
        if (w > 1 && h > 1)
          found.push(`${a.outerHTML.slice(0, 80)} over ${b.outerHTML.slice(0, 80)}`);
      }
    }
  }
  return found;
}"""


#: How far the page, or the job list's own scrolling box, is wider than what shows.
WIDER = """Math.max(document.documentElement.scrollWidth - innerWidth,
  ...[...document.querySelectorAll("#changelist .results")].map(
     el => el.scrollWidth - el.clientWidth))"""


@pytest.fixture
def pages(live_server: Any, django_user_model: Any,
          settings: Any) -> Iterator[list[tuple[str, str]]]:
    """The data every page should show, and the (name, path) of every page."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    django_user_model.objects.create_superuser("admin", "admin@example.com", "admin")
    done = [tasks.record.enqueue(f"done-{i}", extra={"n": i}) for i in range(3)]
    three = tasks.always_fails.enqueue("three attempts")  # max_attempts=3
    progress = tasks.reports_progress.enqueue(500, 0.42, "importing rows")
    waiting = tasks.record.using(delay=3600).enqueue("<b>waiting</b>")
    periodic = tasks.record.using(job_id="cron:tests.testapp.tasks.record:1795456640000",
                                  delay=7200).enqueue("tick")
    with worker_thread(queues=["default"], name="pages-worker"):
        wait_until(lambda: all(j.refresh().is_finished for j in [*done, three, progress]),
                   message="the jobs to finish")
        mirror()
        assert three.status == "failed"
        assert three.attempts == 3
        assert progress.progress == pytest.approx(0.42)
        row = {job.id: Job.objects.get(job_id=job.id).pk
               for job in [*done, three, progress, waiting, periodic]}
        change = "admin:django_delayq_job_change"
        yield [
            ("admin-index", reverse("admin:index")),
            ("admin-app", reverse("admin:app_list", args=["django_delayq"])),
            ("job-list", reverse("admin:django_delayq_job_changelist")),
            ("job-list-failed", reverse("admin:django_delayq_job_changelist")
             + "?status=failed"),
            ("job-three-attempts", reverse(change, args=[row[three.id]])),
            ("job-progress", reverse(change, args=[row[progress.id]])),
            ("job-completed", reverse(change, args=[row[done[0].id]])),
            ("job-scheduled", reverse(change, args=[row[waiting.id]])),
            ("job-periodic", reverse(change, args=[row[periodic.id]])),
            ("dashboard", reverse("admin:django_delayq_queues")),
            ("purge-confirm", reverse("admin:django_delayq_queue_control",
                                      args=["default", "purge"])),
            ("api-root", "/api/delayq/"),
            ("api-queues", "/api/delayq/queues/"),
            ("api-queue", "/api/delayq/queues/default/"),
            ("api-queue-pause", "/api/delayq/queues/default/pause/"),
            ("api-jobs", "/api/delayq/jobs/"),
            ("api-job", f"/api/delayq/jobs/default/{three.id}/"),
            ("api-job-retry", f"/api/delayq/jobs/default/{three.id}/retry/"),
            ("api-job-reschedule", f"/api/delayq/jobs/default/{waiting.id}/reschedule/"),
            ("api-workers", "/api/delayq/workers/"),
            ("api-schema", "/api/delayq/schema/"),
            ("api-swagger", "/api/delayq/schema/swagger/"),
            ("api-redoc", "/api/delayq/schema/redoc/"),
        ]


def logged_in(chromium: Any, base: str, width: int, scheme: str) -> Any:
    context = chromium.new_context(viewport={"width": width, "height": 900},
                                  color_scheme=scheme)
    tab = context.new_page()
    tab.goto(f"{base}/admin/login/")
    tab.fill("#id_username", "admin")
    tab.fill("#id_password", "admin")
    tab.click("input[type=submit]")
    tab.wait_for_selector("#site-name")
    tab.wait_for_load_state("load")
    return tab


def test_every_page_at_two_sizes_light_and_dark(browser, live_server, pages):  # noqa: F811
    SHOTS.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    views = [v for v in VIEWS if v[0] in os.environ.get("DELAYQ_BROWSER_VIEWS", v[0])]
    for view, width, scheme in views:
        tab = logged_in(browser, live_server.url, width, scheme)
        errors: list[str] = []
        tab.on("console", lambda msg, errors=errors: msg.type == "error" and errors.append(
            f"console: {msg.text}"))
        tab.on("pageerror", lambda exc, errors=errors: errors.append(f"page error: {exc}"))
        # A request the browser cancels (net::ERR_ABORTED: the page was left) is no error.
        tab.on("requestfailed", lambda r, errors=errors: "ERR_ABORTED" not in str(
            r.failure) and errors.append(f"request failed: {r.url} {r.failure}"))
        only = os.environ.get("DELAYQ_BROWSER_PAGES")
        for name, path in pages:
            if only and name not in only.split(","):
                continue
            errors.clear()
            response = tab.goto(live_server.url + path)
            assert response is not None
            if name in ("api-swagger", "api-redoc"):
                tab.wait_for_selector(".swagger-ui .info, redoc .api-info, #redoc-container "
                                      ".api-info, .api-content", timeout=20_000)
            status = response.status
            if status >= 500 or status in (403, 404):
                problems.append(f"{view} {name}: HTTP {status}")
            # A GET on an action answers 405 by design: its page shows the form.
            expected_405 = name in ("api-queue-pause", "api-job-retry", "api-job-reschedule")
            if status == 405 and not expected_405:
                problems.append(f"{view} {name}: HTTP 405")
            problems += [f"{view} {name}: {e}" for e in errors
                         if not (expected_405 and "405" in e)]
            problems += [f"{view} {name}: overlap {o}" for o in tab.evaluate(
                OVERLAPS, list(TOOLBARS))]
            if name.startswith(("admin", "job", "dashboard", "purge")):
                wide = tab.evaluate(WIDER)
                if wide > 0:
                    problems.append(f"{view} {name}: {wide} px wider than the window")
            tab.screenshot(path=str(SHOTS / f"{view}-{name}.png"), full_page=True)
        tab.context.close()
    assert not problems, "\n".join(problems)


def test_pages_show_attempts_and_progress(browser, live_server, pages):  # noqa: F811
    tab = logged_in(browser, live_server.url, 1366, "light")
    paths = dict(pages)
    tab.goto(live_server.url + paths["job-three-attempts"])
    assert "3/3" in tab.locator(".field-attempts_display").inner_text()
    assert tab.locator(".dq-act-retry").count() == 1
    assert tab.locator(".dq-act-cancel").count() == 0
    tab.goto(live_server.url + paths["job-progress"])
    assert "42% — importing rows" in tab.locator(".field-progress_display").inner_text()
    tab.goto(live_server.url + paths["job-completed"])
    assert tab.locator(".dq-job-actions").count() == 0
    tab.goto(live_server.url + paths["job-list"])
    assert tab.locator(".dq-periodic").first.inner_text().startswith("⟳ record @ ")
    tab.goto(live_server.url + paths["dashboard"])
    tab.keyboard.press("Tab")
    focused = tab.evaluate("document.activeElement.tagName")
    assert focused in ("A", "BUTTON", "INPUT")
    tab.context.close()
