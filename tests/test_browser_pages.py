"""Every admin page and every API page in headless Chromium, at 1,024 px in light mode and
at 1,920 px in dark mode (the width sets the layout, the scheme only the colours, whose
focus rings are checked in both schemes below): no server error, no console error, no
overlapping controls, and no request to any host but the server under test (so "works
offline" holds on any machine).
The admin is also driven with the keyboard alone, and every control keyboard focus
reaches shows a focus ring.

Screenshots go to test-artifacts/screenshots/pages/ (one per page, size and scheme).
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.urls import reverse
from django.utils import timezone

from django_delayq.models import Job, OutboxEntry
from tests.conftest import ROOT, wait_until, worker_thread
from tests.test_browser import browser, mirror  # noqa: F401 - browser: the fixture
from tests.testapp import tasks

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SHOTS = ROOT / "test-artifacts" / "screenshots" / "pages"
VIEWS = [("1024-light", 1024, "light"), ("1920-dark", 1920, "dark")]

#: Groups of controls that sit side by side; none of their controls may overlap.
TOOLBARS = (".object-tools", ".dq-job-actions", ".dq-controls-row", ".submit-row",
            "#changelist .actions", ".breadcrumbs", "#changelist-search",
            "#changelist-filter", ".xfull", ".paginator",
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
    flow = [tasks.record.using(delay=3600).enqueue("flow 0")]
    for i in (1, 2, 3):
        flow.append(tasks.record.using(depends_on=[flow[-1]]).enqueue(f"flow {i}"))
    parked = OutboxEntry.objects.create(
        job_id="outbox-parked", queue="default", task_name="shop.tasks.gone",
        args='["<b>parked</b>"]', attempts=0, parked_at=timezone.now(),
        error="UnknownTask: no task named 'shop.tasks.gone' is registered")
    outbox_waiting = OutboxEntry.objects.create(
        job_id="outbox-waiting", queue="default", task_name=tasks.record.name,
        args='["waits for Redis"]', attempts=2,
        error="DelayQConnectionError: Redis is unreachable")
    with worker_thread(queues=["default"], name="pages-worker"):
        wait_until(lambda: all(j.refresh().is_finished for j in [*done, three, progress]),
                   message="the jobs to finish")
        mirror()
        assert three.status == "failed"
        assert three.attempts == 3
        assert progress.progress == pytest.approx(0.42)
        history_rows(120)  # the paginator and the date drill-down have something to show
        row = {job.id: Job.objects.get(job_id=job.id).pk
               for job in [*done, three, progress, waiting, periodic, flow[1]]}
        change = "admin:django_delayq_job_change"
        outbox = "admin:django_delayq_outboxentry_change"
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
            ("job-workflow", reverse(change, args=[row[flow[1].id]])),
            ("dashboard", reverse("admin:django_delayq_queues")),
            ("purge-confirm", reverse("admin:django_delayq_queue_control",
                                      args=["default", "purge"])),
            ("outbox-list", reverse("admin:django_delayq_outboxentry_changelist")),
            ("outbox-parked", reverse(outbox, args=[parked.pk])),
            ("outbox-waiting", reverse(outbox, args=[outbox_waiting.pk])),
            ("api-root", "/api/delayq/"),
            ("api-queues", "/api/delayq/queues/"),
            ("api-queue", "/api/delayq/queues/default/"),
            ("api-queue-pause", "/api/delayq/queues/default/pause/"),
            ("api-queue-resume", "/api/delayq/queues/default/resume/"),
            ("api-jobs", "/api/delayq/jobs/"),
            ("api-job", f"/api/delayq/jobs/default/{three.id}/"),
            ("api-job-progress", f"/api/delayq/jobs/default/{progress.id}/"),
            ("api-job-cancel", f"/api/delayq/jobs/default/{waiting.id}/cancel/"),
            ("api-job-retry", f"/api/delayq/jobs/default/{three.id}/retry/"),
            ("api-job-reschedule", f"/api/delayq/jobs/default/{waiting.id}/reschedule/"),
            ("api-workers", "/api/delayq/workers/"),
            ("api-schema", "/api/delayq/schema/"),
            ("api-swagger", "/api/delayq/schema/swagger/"),
            ("api-redoc", "/api/delayq/schema/redoc/"),
        ]


def history_rows(n: int) -> None:
    """``n`` mirrored rows of finished jobs, spread over two years (history Redis no
    longer holds)."""
    start = timezone.now() - dt.timedelta(days=700)
    Job.objects.bulk_create([Job(
        job_id=f"history-{i:03d}", queue="default", task_name=tasks.record.name,
        status="completed", args=[f"h{i}"], run_at=start + dt.timedelta(days=6 * i),
        enqueued_at=start + dt.timedelta(days=6 * i), attempts=1) for i in range(n)])


def logged_in(chromium: Any, base: str, width: int, scheme: str) -> Any:
    """A tab signed in to the admin. Every request to a host other than ``base``'s is
    refused and listed in ``tab.offsite``."""
    context = chromium.new_context(viewport={"width": width, "height": 900},
                                  color_scheme=scheme)
    here = urlsplit(base).netloc
    offsite: list[str] = []

    def only_here(route: Any) -> None:
        if urlsplit(route.request.url).netloc == here:
            route.continue_()
        else:
            offsite.append(route.request.url)
            route.abort()

    context.route("**/*", only_here)
    tab = context.new_page()
    tab.offsite = offsite
    tab.goto(f"{base}/admin/login/")
    tab.fill("#id_username", "admin")
    tab.fill("#id_password", "admin")
    tab.click("input[type=submit]")
    tab.wait_for_selector("#site-name")
    tab.wait_for_load_state("load")
    return tab


@pytest.mark.timeout(900)  # some 50 page loads and screenshots: minutes when busy
def test_every_page_at_two_sizes_and_in_both_schemes(browser, live_server, pages):  # noqa: F811
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
            tab.offsite.clear()
            response = tab.goto(live_server.url + path)
            assert response is not None
            if name in ("api-swagger", "api-redoc"):
                tab.wait_for_selector(".swagger-ui .info, redoc .api-info, #redoc-container "
                                      ".api-info, .api-content", timeout=20_000)
            status = response.status
            if status >= 500 or status in (403, 404):
                problems.append(f"{view} {name}: HTTP {status}")
            # A GET on an action answers 405 by design: its page shows the form.
            expected_405 = name in ("api-queue-pause", "api-queue-resume", "api-job-cancel",
                                    "api-job-retry", "api-job-reschedule")
            if status == 405 and not expected_405:
                problems.append(f"{view} {name}: HTTP 405")
            problems += [f"{view} {name}: {e}" for e in errors
                         if not (expected_405 and "405" in e)
                         and not any(url in e for url in tab.offsite)]  # listed below
            problems += [f"{view} {name}: requested another host: {url}"
                         for url in tab.offsite]
            problems += [f"{view} {name}: overlap {o}" for o in tab.evaluate(
                OVERLAPS, list(TOOLBARS))]
            if name.startswith(("admin", "job", "dashboard", "purge", "outbox")):
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
    tab.goto(live_server.url + paths["job-workflow"])
    tree = tab.locator(".dq-workflow")
    assert tree.locator(".dq-tree-parents a").count() == 1
    assert tree.locator(".dq-tree-children a").count() == 2  # two levels of dependants
    assert tree.locator(".dq-tree-children ul ul .dq-status-waiting").count() == 1
    tab.goto(live_server.url + paths["outbox-list"])
    assert tab.locator("#result_list tbody tr").count() == 2
    tab.goto(live_server.url + paths["outbox-parked"])
    assert "UnknownTask: no task named" in tab.locator(".field-error_display").inner_text()
    tab.goto(live_server.url + paths["api-job-progress"])
    body = tab.locator(".response-info").inner_text()
    assert '"progress": 0.42' in body
    assert '"progress_message": "importing rows"' in body
    tab.context.close()


# -- the keyboard ---------------------------------------------------------------------

#: The keyboard focus now: the element, its outline, and the background the outline is
#: drawn on (the nearest ancestor with an opaque one); null on the page itself.
FOCUSED = """() => {
  const el = document.activeElement;
  if (!el || el === document.body || el === document.documentElement) return null;
  const style = getComputedStyle(el);
  let bg = "rgb(255, 255, 255)";
  for (let p = el.parentElement; p; p = p.parentElement) {
    const c = getComputedStyle(p).backgroundColor;
    const alpha = c.startsWith("rgba") ? parseFloat(c.split(",")[3]) : 1;
    if (alpha > 0.5) { bg = c; break; }
  }
  return {html: el.outerHTML.slice(0, 90), shown: el.getClientRects().length > 0,
          style: style.outlineStyle, width: parseFloat(style.outlineWidth),
          color: style.outlineColor, bg: bg};
}"""


def luminance(css: str) -> float:
    """The relative luminance (WCAG) of an ``rgb(...)``/``rgba(...)`` colour."""
    channels = [float(v) / 255 for v in css[css.index("(") + 1:-1].split(",")[:3]]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def ring_problem(focus: dict[str, Any] | None) -> str | None:
    """Why the focused control shows no clear focus ring (None: it does): a 2 px outline
    at least, 3:1 against what is behind it (WCAG's non-text contrast)."""
    if focus is None or not focus["shown"]:
        return None
    if focus["style"] in ("none", "hidden") or focus["width"] < 2:
        return f"no outline ({focus['style']} {focus['width']}px): {focus['html']}"
    ratio = contrast(focus["color"], focus["bg"])
    if ratio < 3:
        return (f"outline {focus['color']} on {focus['bg']} is {ratio:.1f}:1: "
                f"{focus['html']}")
    return None


def focus_on(tab: Any, selector: str, *, key: str = "Tab", limit: int = 250) -> None:
    """Press ``key`` until the element ``selector`` has the focus, and check its ring."""
    for _ in range(limit):
        tab.keyboard.press(key)
        if tab.evaluate("(s) => document.activeElement.matches(s)", selector):
            problem = ring_problem(tab.evaluate(FOCUSED))
            assert problem is None, problem
            return
    raise AssertionError(f"{key} never reached {selector}")


def press(tab: Any, key: str) -> None:
    """Press ``key`` on the focused control and wait for the page it leads to."""
    with tab.expect_navigation():
        tab.keyboard.press(key)


def test_pause_retry_purge_and_resume_with_the_keyboard_alone(browser, live_server,  # noqa: F811
                                                             pages):
    from django_delayq import Job as LiveJob
    from django_delayq import Queue
    from django_delayq.engine.status import PURGEABLE

    paths = dict(pages)
    three = Job.objects.get(pk=int(paths["job-three-attempts"].rstrip("/").split("/")[-2]))
    tab = logged_in(browser, live_server.url, 1366, "light")
    tab.goto(live_server.url + paths["dashboard"])
    focus_on(tab, "#queue-default button.dq-pause")
    press(tab, "Enter")
    assert Queue("default").is_paused

    tab.goto(live_server.url + paths["job-three-attempts"])
    focus_on(tab, "button.dq-act-retry")
    press(tab, "Enter")
    assert "1 job(s) retried" in tab.locator(".messagelist:not(.dq-warnings)").inner_text()
    assert LiveJob.fetch(three.job_id, "default").status == "ready"  # paused: it waits

    tab.goto(live_server.url + paths["dashboard"])
    focus_on(tab, "#queue-default a.dq-purge")
    press(tab, "Enter")
    assert tab.locator(".dq-confirm-purge").count() == 1
    focus_on(tab, "a.cancel-link")  # past the button, then back to it
    focus_on(tab, "input.dq-confirm-purge", key="Shift+Tab", limit=1)
    press(tab, "Enter")
    assert "Queue default purged" in tab.locator(".messagelist:not(.dq-warnings)").inner_text()
    counts = Queue("default").counts()
    assert {status: counts[status] for status in PURGEABLE} == dict.fromkeys(PURGEABLE, 0)

    focus_on(tab, "#queue-default button.dq-resume")
    press(tab, " ")  # Space presses a button too
    assert not Queue("default").is_paused
    tab.context.close()


#: The pages whose every control keyboard focus reaches is checked for a focus ring.
RING_PAGES = ("admin-app", "job-list", "job-three-attempts", "dashboard", "purge-confirm",
              "outbox-list", "outbox-parked")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_every_control_shows_a_focus_ring(browser, live_server, pages, scheme):  # noqa: F811
    paths = dict(pages)
    tab = logged_in(browser, live_server.url, 1366, scheme)
    problems: list[str] = []
    for name in RING_PAGES:
        tab.goto(live_server.url + paths[name])
        seen = 0
        for _ in range(400):  # Tab through the whole page, until the focus leaves it
            tab.keyboard.press("Tab")
            focus = tab.evaluate(FOCUSED)
            if focus is None:
                break
            seen += 1
            problem = ring_problem(focus)
            if problem:
                problems.append(f"{scheme} {name}: {problem}")
        assert seen > 5, name
    tab.context.close()
    assert not problems, "\n".join(dict.fromkeys(problems))
