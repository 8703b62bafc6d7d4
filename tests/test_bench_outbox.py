"""``python -m bench.outbox`` end to end on a tiny scale, so it cannot rot (no timing
asserted).

It runs on the PostgreSQL server of the tests (tests/services.py), in a database of its
own that it creates and drops, and writes its figures to ``outbox.json``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_bench_script


@pytest.mark.slow
@pytest.mark.postgres
def test_the_outbox_bench_reports_every_figure(tmp_path: Path) -> None:
    data = run_bench_script("outbox", "--transactions", "5", "--rows", "20", "--samples", "2",
                            out=tmp_path)
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
