"""``python -m bench.shards`` end to end on a tiny scale, so it cannot rot: every shard on
one throwaway Redis (``--one-server``), each row run by this checkout's workers and, as
``--baseline``, by the same checkout again. No timing is asserted: only the shape of
the results file and that the report renders it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import tables

ROOT = Path(__file__).resolve().parent.parent


def test_one_server_rows_with_a_baseline(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.shards", "--jobs", "2000", "--prefetch", "16",
         "--one-server", "--baseline", str(ROOT), "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not (tmp_path / "shards.json").exists(), "the cluster's file is left alone"
    data = json.loads((tmp_path / "shards_one_server.json").read_text())
    assert (data["benchmark"], data["jobs"], data["baseline"]) == (
        "shards_one_server", 2000, ROOT.name)
    rows = data["rows"]
    assert [(r["prefetch"], r["shards"], r["code"]) for r in rows] == [
        (16, shards, code) for shards in (1, 2, 3) for code in ("baseline", "current")]
    for row in rows:
        assert row["runs"] == 1
        for key in ("jobs_per_s", "redis_cpu_us_per_job", "workers_cpu_us_per_job",
                    "script_calls_per_1000_jobs", "jobs_per_s_per_core",
                    "primaries_bound_jobs_per_s"):
            assert row[key] > 0, (key, row)
        assert len(row["redis_cpu_us_per_job_per_node"]) == 1
        assert row["jobs_per_s_per_core"] == round(
            1e6 / (row["redis_cpu_us_per_job"] + row["workers_cpu_us_per_job"]))
    lines = tables.shards(data)
    assert "`python -m bench.shards --one-server`" in lines[0]
    assert sum(line.startswith("| 16 | ") for line in lines) == 6
