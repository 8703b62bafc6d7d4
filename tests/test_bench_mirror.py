"""``python -m bench.mirror`` end to end on a tiny scale, so it cannot rot (no timing
asserted).

Its PostgreSQL run uses the server of the tests (tests/services.py), in a database of
its own that it creates and drops; it writes its figures to ``mirror.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import services

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
@pytest.mark.postgres
def test_the_mirror_bench_reports_every_figure(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["DELAYQ_BENCH_PG"] = ":".join(services.pg_conninfo())  # the suite's server
    done = subprocess.run(
        [sys.executable, "-m", "bench.mirror", "--jobs", "40", "--claim", "8",
         "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    data = json.loads((tmp_path / "mirror.json").read_text())
    assert data["benchmark"] == "mirror"
    assert data["environment"]["load_average_start"]
    assert (data["jobs"], data["claim"]) == (40, 8)
    assert set(data["backends"]) == {"sqlite", "postgresql"}
    for backend, figures in data["backends"].items():
        assert figures["database_version"].startswith(("SQLite ", "PostgreSQL ")), backend
        assert set(figures["runs"]) == {"backlog", "replay", "in_step"}
        for run in figures["runs"].values():
            # 40 jobs: 40 enqueued entries, and a claimed, a started and a completed
            # entry for each 8
            assert (run["jobs"], run["entries"], run["events"]) == (40, 55, 160)
            assert run["cpu_us_per_job"] > 0
            assert run["redis_cpu_us_per_job"] >= 0
            assert (run["database_cpu_us_per_job"] is None) == (backend == "sqlite")
