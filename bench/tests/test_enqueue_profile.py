"""``bench.enqueue_profile`` runs every row end to end: each part it takes out of
``enqueue.lua`` is still there to take out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.enqueue_profile import FLOOR, LEFT_OUT, variant_sources

ROOT = Path(__file__).resolve().parents[2]


def test_each_variant_differs_from_the_script_by_its_part() -> None:
    sources = variant_sources()
    assert set(sources) == {*LEFT_OUT, FLOOR}
    taken_out = [name for name in LEFT_OUT if name != "as it is"]
    assert all(sources[name] != sources["as it is"] for name in taken_out)


def test_every_row_is_measured(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.enqueue_profile", "--scale", "0.02", "--rounds", "2",
         "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(row["row"], row["when"]): row
            for row in json.loads((tmp_path / "enqueue_profile.json").read_text())["rows"]}
    assert set(rows) == {(name, when) for name in (*LEFT_OUT, FLOOR)
                         for when in ("now", "delay 60 s")}
    assert all(row["usec_per_call"] > 0 for row in rows.values())
    # A job hash without two of its fields is smaller (MEMORY USAGE, not a timing).
    for when in ("now", "delay 60 s"):
        assert (rows["hash without 'e' and 'a'", when]["hash_bytes"]
                < rows["as it is", when]["hash_bytes"])
        assert rows["no job hash (HSET)", when]["hash_bytes"] is None
