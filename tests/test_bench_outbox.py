"""``python -m bench.outbox`` end to end on a tiny scale, so it cannot rot (no timing
asserted).

It runs on the PostgreSQL server of the tests (tests/services.py), in a database of its
own that it creates and drops, and writes its figures to ``outbox.json``.
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
def test_the_outbox_bench_reports_every_figure(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["DELAYQ_BENCH_PG"] = ":".join(services.pg_conninfo())  # the suite's server
    done = subprocess.run(
        [sys.executable, "-m", "bench.outbox", "--transactions", "5", "--rows", "20",
         "--samples", "2", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    data = json.loads((tmp_path / "outbox.json").read_text())
    assert data["benchmark"] == "outbox"
    assert data["environment"]["load_average_start"]
    assert [t["label"] for t in data["timed"]] == [
        "an INSERT alone (no job)", "INSERT + enqueue_on_commit",
        "INSERT + enqueue_in_transaction (hook sends)",
        "INSERT + enqueue_in_transaction (no hook)"]
    assert all(t["us_per_transaction"] > 0 for t in data["timed"])
    assert data["relay"]["rows"] == 5
    assert data["relay"]["rows_per_s"] > 0
    back = data["redis_back"]
    assert back["rows"] == 20
    assert 0 <= back["first_ms"] <= back["all_ms"]
    assert data["relay_only"]["samples"] == 2
    assert data["relay_only"]["p50_ms"] > 0
