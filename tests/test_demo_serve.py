"""``make serve``: after the demo, its Redis, a worker and runserver stay up and serve
the demo's jobs (the admin styled, the API's Swagger UI drawn) until SIGTERM (or
Ctrl-C), which stops all three."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT, OutputReader, wait_until
from tests.servers import quiet_port

pytestmark = pytest.mark.slow

#: The demo's tasks, each of which has a job in the job list once the demo ran.
DEMO_TASKS = ("send_receipt", "charge_card", "sync_inventory", "nightly_report")


class Browser:
    """An HTTP client that keeps the session cookie, as a browser does."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(
            self.cookies))

    def get(self, path: str) -> tuple[int, str, str]:
        """Status, content type and body of a GET."""
        with self.opener.open(self.base + path, timeout=30) as page:
            return page.status, page.headers.get("Content-Type", ""), page.read().decode()

    def log_in(self, username: str, password: str) -> None:
        _, _, form = self.get("/admin/login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form)
        assert token, form[:500]
        body = urllib.parse.urlencode({"csrfmiddlewaretoken": token[1], "username": username,
                                       "password": password, "next": "/admin/"}).encode()
        with self.opener.open(self.base + "/admin/login/", body, timeout=30) as page:
            assert page.url.endswith("/admin/"), page.url  # the index, not the form again


def test_serve_leaves_the_demo_running_until_stopped(tmp_path: Path) -> None:
    port = quiet_port()  # bound later, by another process
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE", "DELAYQ_TEST_REDIS_URL",
                        "DJANGO_DEBUG")}
    env.update(DEMO_PORT=str(port), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1",
               EXAMPLE_DB=str(tmp_path / "demo.sqlite3"))
    demo = subprocess.Popen([sys.executable, "example_project/demo.py", "--serve"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    output = OutputReader(demo)
    try:
        output.wait_for("Serving: http://127.0.0.1", timeout=240)
        base = f"http://127.0.0.1:{port}"
        output.wait_for("Quit the server with", timeout=60)  # runserver is up
        browser = Browser(base)
        browser.log_in("admin", "admin")

        # DEBUG stays off, and the static files are served all the same.
        _, _, index = browser.get("/admin/")
        css = re.findall(r'href="(/static/admin/css/[^"]+\.css)"', index)
        assert css, index[:1000]
        for path in css:
            status, kind, _ = browser.get(path)
            assert (status, kind.split(";")[0]) == (200, "text/css"), path
        _, _, swagger = browser.get("/api/delayq/schema/swagger/")
        [bundle] = re.findall(r'src="([^"]*swagger-ui-bundle\.js)"', swagger)
        status, _, script = browser.get(bundle)
        assert (status, len(script) > 100_000) == (200, True), bundle
        with pytest.raises(urllib.error.HTTPError) as missing:
            browser.get("/no-such-page/")
        assert missing.value.code == 404
        assert b"DELAYQ" not in missing.value.read()  # no debug page, no settings shown

        def with_worker_alive() -> str | None:
            """The metrics once the served worker has sent its first heartbeat."""
            _, _, text = browser.get("/metrics/delayq/")
            return text if "delayq_workers_alive 1.0" in text else None

        metrics = wait_until(with_worker_alive, timeout=120, interval=0.5,
                             message="the served worker's heartbeat")
        # The demo's eight jobs, finished, are in the Redis the admin reads.
        completed = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                        if line.startswith("delayq_jobs_completed_total{"))
        assert completed == 8, metrics
        # ... and in the job list the admin shows.
        _, _, jobs = browser.get("/admin/django_delayq/job/")
        assert "8 jobs" in jobs, jobs[-3000:]
        for name in DEMO_TASKS:
            assert f">{name}<" in jobs, name
        assert jobs.count("dq-status-completed") == 8
    finally:
        demo.send_signal(signal.SIGTERM)
        code = demo.wait(timeout=60)
    assert code == 0, output.text[-3000:]
