"""The benchmark tool end to end on a tiny scale, so it cannot rot.

Runs ``python -m bench.run`` in a subprocess, as ``make bench`` does, with its own
throwaway Redis, and reads the ``latest.json`` and ``latest.md`` it writes. Only
django-delayq and the ZADD ceiling are measured, plus RQ when the peers' virtualenv
already exists (``make bench`` creates it; this test never installs it); django-delayq's
own rows run once each (pool, defaults, replicas; the time-limit row, one flag more, is
left to ``make bench``: bench/tests checks its command line). No timing is asserted:
only the shape of the results and that every figure is a positive number. The tool's
own parts have their tests in bench/tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PEERS_PYTHON = ROOT / "bench" / ".venv-peers" / "bin" / "python"
LIBRARY_KEYS = {
    "enqueue_per_s",
    "bulk_enqueue_per_s",
    "process_per_s_1proc",
    "process_per_s_2proc",
    "lateness_ms",
    "early",
    "redis_bytes_per_delayed_job",
    "enqueue_growth_ratio",
    "enqueue_vs_zadd",
    "enqueue_growth_ratio_vs_zadd",
}
CPU_KEYS = {
    "enqueue_cpu_us",
    "process_cpu_us_per_job_1proc",
    "process_cpu_us_per_job_2proc",
    "cores_busy_1proc",
    "cores_busy_2proc",
    "process_2proc_cpu_bound_x",
}


@pytest.fixture(scope="module")
def bench_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    libraries = ["django_delayq"] + (["rq"] if PEERS_PYTHON.exists() else [])
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--scale", "0.001", "--runs", "1",
         "--libraries", ",".join(libraries), "--time-limit-pairs", "0", "--default-runs", "1",
         "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def data(bench_output: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((bench_output / "latest.json").read_text())
    return loaded


def test_json_has_every_figure_for_each_library(data: dict[str, Any]) -> None:
    assert set(data) == {"environment", "results", "ceiling", "configurations", "replication"}
    env = data["environment"]
    for key in ("python", "redis_version", "cpu", "library_versions", "date",
                "load_average_start", "load_average_end"):
        assert env[key], key
    assert env["errors"] == {}
    assert "django_delayq" in data["results"]
    for lib, res in data["results"].items():
        assert set(res) == LIBRARY_KEYS | CPU_KEYS, lib
        for key in LIBRARY_KEYS - {"lateness_ms", "early"}:
            assert res[key] > 0, (lib, key)
        assert set(res["lateness_ms"]) == {"p50", "p95", "p99", "max"}
        # Lateness may be negative only if jobs start early, which `early` counts.
        assert res["early"] >= 0
        assert all(isinstance(v, float) for v in res["lateness_ms"].values())
        # Every enqueue costs CPU on both sides; a tiny backlog drains too fast for CPU
        # counted in clock ticks, and its processing run then has no per-job figure.
        assert res["enqueue_cpu_us"]["client"] > 0
        assert res["enqueue_cpu_us"]["redis"] > 0
        for procs in ("1proc", "2proc"):
            per_job = res[f"process_cpu_us_per_job_{procs}"]
            assert set(per_job) == {"workers", "redis"}
            assert all(v is None or v > 0 for v in per_job.values()), (lib, per_job)
    assert data["ceiling"]["zadd_single_per_s"] > 0
    assert data["ceiling"]["zadd_pipelined_per_s"] > 0
    floor = data["ceiling"]["redis_cpu_us_per_call"]
    assert set(floor) == {"lpush", "evalsha_return_1"}
    assert all(v > 0 for v in floor.values()), floor


def test_replicas_row(data: dict[str, Any]) -> None:
    replication = data["replication"]
    for kind in ("single", "bulk"):
        for n in (0, 1):
            assert replication[f"{kind}_per_s_min_replicas_{n}"] > 0, (kind, n)


def test_pool_and_default_configuration_rows(data: dict[str, Any]) -> None:
    configs = data["configurations"]
    pool = configs["pool"]
    assert pool["separate"]["per_s"][0] > 0
    assert pool["pool"]["per_s"][0] > 0
    assert pool["pool_vs_separate"] > 0
    assert "time_limits" not in configs  # asked for no runs
    defaults = configs["defaults"]
    for key in ("mirror", "no_mirror"):
        assert defaults[key]["errors"] == [], key
        assert defaults[key]["median"] > 0, key
    # The mirror caught up: every event of the run was in the database at some point.
    assert defaults["mirror"]["settled_after_last_s_median"] >= 0
    assert defaults["mirror"]["drained_to_database_per_s"] > 0
    assert configs["load_average_start"]


def test_markdown_tables_and_chart(bench_output: Path) -> None:
    md = (bench_output / "latest.md").read_text()
    assert "| django-delayq |" in md
    assert "## Targets" in md
    assert "| single (200 jobs), jobs/s |" in md, "the MIN_REPLICAS table"
    assert "| one `runworker --processes 2` |" in md
    assert "| `runworker` (default: with the mirror) |" in md
    if importlib.util.find_spec("matplotlib") is not None or PEERS_PYTHON.exists():
        assert (bench_output / "latest.png").read_bytes().startswith(b"\x89PNG")
