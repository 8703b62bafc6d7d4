"""``bench.enqueue_profile`` runs every row end to end: each part it takes out of
``enqueue.lua`` is still there to take out."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import redis

from bench.enqueue_profile import FLOOR, LEFT_OUT, SAME_COMMANDS, job_call, variant_sources

ROOT = Path(__file__).resolve().parents[2]


def test_each_variant_differs_from_the_script_by_its_part() -> None:
    sources = variant_sources()
    assert set(sources) == {*LEFT_OUT, SAME_COMMANDS, FLOOR}
    taken_out = [name for name in LEFT_OUT if name != "as it is"]
    assert all(sources[name] != sources["as it is"] for name in taken_out)


def test_every_row_is_measured(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.enqueue_profile", "--scale", "0.02", "--rounds", "2",
         "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(row["row"], row["when"]): row
            for row in json.loads((tmp_path / "enqueue_profile.json").read_text())["rows"]}
    assert set(rows) == {(name, when) for name in (*LEFT_OUT, SAME_COMMANDS, FLOOR)
                         for when in ("now", "delay 60 s")}
    assert all(row["usec_per_call"] > 0 for row in rows.values())
    # A job hash without two of its fields is smaller (MEMORY USAGE, not a timing).
    for when in ("now", "delay 60 s"):
        assert (rows["hash without 'e' and 'a'", when]["hash_bytes"]
                < rows["as it is", when]["hash_bytes"])
        assert rows["no job hash (HSET)", when]["hash_bytes"] is None


def test_the_same_commands_row_writes_what_the_script_writes(redis_url: str) -> None:
    """Its Redis work is the script's for one plain job: the same keys, of the same types,
    and a job hash with the same fields."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    sources = variant_sources()
    written = {}
    for name in ("as it is", SAME_COMMANDS):
        client.flushall()
        for delay in ("", 60_000):
            keys, args = job_call(f"job-{delay or 'now'}", delay)
            client.eval(sources[name], len(keys), *keys, *args)
        written[name] = {key: (client.type(key), sorted(client.hkeys(key))
                               if client.type(key) == "hash" else client.zcard(key)
                               if client.type(key) == "zset" else None)
                         for key in client.keys("*")}
    assert written["as it is"] == written[SAME_COMMANDS]
