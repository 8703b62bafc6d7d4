"""``make serve``: after the demo, its Redis, a worker and runserver stay up and serve
the demo's jobs until SIGTERM (or Ctrl-C), which stops all three."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from django_delayq.testing import free_port
from tests.conftest import ROOT, OutputReader, wait_until

pytestmark = pytest.mark.slow


def test_serve_leaves_the_demo_running_until_stopped() -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE", "DELAYQ_TEST_REDIS_URL")}
    env.update(DEMO_PORT=str(port), PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    demo = subprocess.Popen([sys.executable, "example_project/demo.py", "--serve"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    output = OutputReader(demo)
    try:
        output.wait_for("Serving: http://127.0.0.1", timeout=240)
        base = f"http://127.0.0.1:{port}"
        output.wait_for("Quit the server with", timeout=60)  # runserver is up
        with urllib.request.urlopen(f"{base}/admin/login/", timeout=30) as page:
            assert page.status == 200
        def with_worker_alive() -> str | None:
            """The metrics once the served worker has sent its first heartbeat."""
            with urllib.request.urlopen(f"{base}/metrics/delayq/", timeout=30) as page:
                text = page.read().decode()
            return text if "delayq_workers_alive 1.0" in text else None

        metrics = wait_until(with_worker_alive, timeout=120, interval=0.5,
                             message="the served worker's heartbeat")
        # The demo's eight jobs, finished, are in the Redis the admin reads.
        completed = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                        if line.startswith("delayq_jobs_completed_total{"))
        assert completed == 8, metrics
    finally:
        demo.send_signal(signal.SIGTERM)
        code = demo.wait(timeout=60)
    assert code == 0, output.text[-3000:]
