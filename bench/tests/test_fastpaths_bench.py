"""``bench.fastpaths`` runs every row end to end: each fast path it swaps still exists."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_fast_path_is_timed_both_ways(tmp_path: Path) -> None:
    # A process of its own: the script configures Django itself.
    done = subprocess.run(
        [sys.executable, "-m", "bench.fastpaths", "--scale", "0.01", "--rounds", "2",
         "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "fastpaths.json").read_text())["rows"]
    assert [row["row"] for row in rows] == [
        f"{path}, {mode}" for path in ("pinned", "packed", "shape", "plain")
        for mode in ("single", "bulk")]
    assert all(min(row["per_s"]) > 0 for row in rows)
