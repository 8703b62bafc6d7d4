"""``python -m bench.sizing`` end to end on a small scale, so it cannot rot; its
figures are memory, not time, so the test checks what they must show."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import tables
from tests.conftest import run_bench_script


@pytest.mark.slow
def test_the_sizing_bench_reports_every_figure(tmp_path: Path) -> None:
    data = run_bench_script("sizing", "--jobs", "1000", out=tmp_path)
    this = data["this"]
    assert this["jobs"] == 1000
    assert 0 < this["ready"] < this["finished"] < this["failed"]
    assert 0 < this["event_bulk"] < this["event_single"]
    assert this["queue"] > 0
    kept = this["kept_after"]
    assert (kept["finished"], kept["keep_completed"]) == (4000, 250)
    assert kept["job_records"] == 250  # KEEP_COMPLETED bounds the records themselves
    rows = tables.sizing(data)
    assert any("KEEP_COMPLETED=250" in row for row in rows)
