"""``python -m bench.mirror`` end to end on a tiny scale, so it cannot rot (no timing
asserted).

Its PostgreSQL run uses the server of the tests (tests/services.py), in a database of
its own that it creates and drops; it writes its figures to ``mirror.json``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_bench_script


@pytest.mark.slow
@pytest.mark.postgres
def test_the_mirror_bench_reports_every_figure(tmp_path: Path) -> None:
    data = run_bench_script("mirror", "--jobs", "40", "--claim", "8", out=tmp_path)
    assert (data["jobs"], data["claim"]) == (40, 8)
    assert set(data["backends"]) == {"sqlite", "postgresql"}
    for backend, figures in data["backends"].items():
        assert figures["database_version"].startswith(("SQLite ", "PostgreSQL ")), backend
        assert set(figures["runs"]) == {"backlog", "replay", "in_step", "trimmed"}
        for run in figures["runs"].values():
            # 40 jobs: 40 enqueued entries, and a claimed, a started and a completed
            # entry for each 8
            assert (run["jobs"], run["entries"], run["events"]) == (40, 55, 160)
            assert run["cpu_us_per_job"] > 0
            assert run["redis_cpu_us_per_job"] >= 0
            assert (run["database_cpu_us_per_job"] is None) == (backend == "sqlite")
