"""latest.md from the results files: every table, every target, the load of each run.

``data/`` holds results files written by the scripts themselves at a tiny scale, so a
change of a script's output that the report does not follow fails here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import report, tables

DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture
def latest() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DATA / "latest.json").read_text())
    return loaded


def _peers(latest: dict[str, Any]) -> dict[str, Any]:
    """The fixture with two made-up peers beside django-delayq."""
    ours = latest["results"]["django_delayq"]
    latest["results"] = {"django_delayq": ours}
    latest["results"]["rq"] = {**ours, "enqueue_per_s": 3_000.0, "process_per_s_1proc": 300.0}
    latest["results"]["huey"] = {**ours, "enqueue_per_s": 8_000.0, "process_per_s_1proc": 3_000.0}
    return latest


def test_every_target_names_a_figure_the_run_writes(latest: dict[str, Any]) -> None:
    rows = report.evaluate_targets(_peers(latest), report.load_targets())
    assert rows
    missing = [row["description"] for row in rows if row["value"] is None]
    assert missing == []
    assert all(row["holds"] is not None for row in rows)


def test_a_target_against_the_best_peer(latest: dict[str, Any]) -> None:
    data = _peers(latest)
    data["results"]["django_delayq"]["enqueue_per_s"] = 7_000.0
    target = {"description": "d", "metric": "results.django_delayq.enqueue_per_s",
              "op": ">=", "ref": "best_peer:enqueue_per_s"}
    (row,) = report.evaluate_targets(data, [target])
    assert (row["reference"], row["holds"]) == (8_000.0, False)
    assert row["reference_text"] == "Huey enqueue_per_s"
    (row,) = report.evaluate_targets(data, [{**target, "peers": ["rq"], "factor": 2}])
    assert (row["reference"], row["holds"]) == (6_000.0, True)
    (row,) = report.evaluate_targets(data, [{**target, "metric": "results.nobody.x"}])
    assert row["holds"] is None


def test_a_target_may_add_figures(latest: dict[str, Any]) -> None:
    ours = latest["results"]["django_delayq"]
    ours["process_cpu_us_per_job_1proc"] = {"workers": 12.0, "redis": 14.0}
    cpu = "results.django_delayq.process_cpu_us_per_job_1proc."
    target = {"description": "d", "metric": f"{cpu}workers + {cpu}redis", "op": "<=", "ref": 25}
    (row,) = report.evaluate_targets(latest, [target])
    assert (row["value"], row["holds"]) == (26.0, False)
    (row,) = report.evaluate_targets(latest, [{**target, "metric": f"{cpu}workers + {cpu}x"}])
    assert (row["value"], row["holds"]) == (None, None)


def test_every_results_file_gets_its_section(latest: dict[str, Any]) -> None:
    others = report.load_others(DATA)
    assert set(others) == set(tables.SCRIPTS)
    md = report.markdown(latest, others)
    for name in others:
        title = tables.SCRIPTS[name][0]
        assert f"## {title}" in md, name
        env = others[name]["environment"]
        # each section says when it ran and under what load
        assert tables.ran(env) in md
    assert "| 16 | 3 | current | " in md  # the 3-shard row with claims of about 20
    assert "| celery | " in md
    assert "| INSERT + enqueue_on_commit | " in md
    assert "| `enqueue_many` | " in md
    assert "- Export: 8,000 events" in md
    assert "`enqueue_dataframe` on a standalone cluster" in md
    assert "| SQLite 3.40.1 | backlog | " in md
    assert "| PostgreSQL 15.20 | in step | " in md
    assert "| current | 5,000 | 5 | " in md  # a scrape's round trips with 5,000 queues


def test_django_delayq_rows_beside_the_tuned_worker(latest: dict[str, Any]) -> None:
    md = report.markdown(latest)
    configs = latest["configurations"]
    assert "| one `runworker --processes 2` |" in md
    assert "| `--timeout 60` |" in md
    assert f"With / without: {configs['time_limits']['ratio']:.3f}." in md
    tuned = latest["results"]["django_delayq"]["process_per_s_1proc"]
    assert f"(8 threads, `--no-mirror`, `-v 0`): {tuned:,.0f} jobs/s" in md
    assert "| single (200 jobs), jobs/s |" in md
    assert "## Targets" in md
    assert "| Celery | " in md  # the peers' table


def test_missing_figures_read_n_a(latest: dict[str, Any]) -> None:
    configs = latest["configurations"]
    configs["defaults"]["mirror"].update(median=None, spread=None, per_s=[],
                                         settled_after_last_s_median=None)
    configs["defaults"]["mirror_vs_no_mirror"] = None
    md = report.markdown(latest, {})
    assert "Default / `--no-mirror`: n/a." in md
