"""The task bodies and the count reports, on a real Redis."""

from __future__ import annotations

import os
import time

import pytest
import redis

from bench.harness import marks


def test_plain_connection_speaks_resp_through_hiredis(redis_url: str) -> None:
    conn = marks.PlainConnection(redis_url.rsplit("/", 1)[0] + "/3")
    try:
        assert conn.call("SET", "k", "v") == b"OK"
        assert conn.call("INCRBY", "n", 5) == 5
        assert conn.call("GET", "k") == b"v"
        assert conn.call("GET", "missing") is None
        assert conn.call("ECHO", "x" * 200_000) == b"x" * 200_000  # a reply in many reads
        with pytest.raises(RuntimeError, match="WRONGTYPE"):
            conn.call("LPUSH", "k", "x")
    finally:
        conn.close()
    # SELECT 3 was sent: the keys are in database 3, not 0.
    assert redis.Redis.from_url(redis_url).get("k") is None
    assert redis.Redis.from_url(redis_url.rsplit("/", 1)[0] + "/3").get("k") == b"v"


def _report(r: redis.Redis, pid: int, first: bool, jobs: int) -> int:
    return int(r.evalsha(r.script_load(marks.lua("done")), len(marks.DONE_KEYS),
                         *marks.DONE_KEYS, pid, int(first), jobs, 10, 90, 100))


def _count(r: redis.Redis, key: str) -> int | None:
    value = r.get(key)
    return None if value is None else int(value.split()[0])


def test_a_report_marks_each_count_it_passes(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    assert _report(r, 1, True, 5) == 5
    assert _count(r, marks.FIRST_KEY) == 5
    assert _count(r, marks.WINDOW_LO_KEY) is None
    assert _report(r, 2, True, 3) == 8  # a second process's first report
    assert _report(r, 1, False, 4) == 12  # passes lo = 10
    assert _count(r, marks.WINDOW_LO_KEY) == 12
    assert _report(r, 2, False, 80) == 92  # passes hi = 90, not n = 100
    assert _count(r, marks.WINDOW_HI_KEY) == 92
    assert _count(r, marks.LAST_KEY) is None
    assert _report(r, 1, False, 8) == 100
    assert _count(r, marks.LAST_KEY) == 100
    firsts = {int(k): int(v.split()[0]) for k, v in r.hgetall(marks.FIRSTS_KEY).items()}
    assert firsts == {1: 5, 2: 8}
    # The marks hold the Redis time in full microseconds, in order.
    stamps = [float(r.get(k).split()[1]) for k in (marks.FIRST_KEY, marks.WINDOW_LO_KEY,
                                                    marks.WINDOW_HI_KEY, marks.LAST_KEY)]
    assert stamps == sorted(stamps)
    assert all(len(r.get(k).split()[1].split(b".")[1]) == 6 for k in (marks.FIRST_KEY,))


def test_mark_done_reaches_the_shared_count(redis_url: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    r = redis.Redis.from_url(redis_url)
    r.set(marks.WINDOW_KEY, "10 90 100")
    monkeypatch.setattr(marks, "_reporter", None)  # a reporter of this test's server
    for _ in range(100):
        marks.mark_done()
    deadline = time.monotonic() + 10
    while int(r.get(marks.COUNT_KEY) or 0) < 100:
        assert time.monotonic() < deadline, "the count never reached Redis"
        time.sleep(0.01)
    assert _count(r, marks.LAST_KEY) == 100
    assert list(r.hgetall(marks.FIRSTS_KEY)) == [str(os.getpid()).encode()]


def test_lateness_client_is_ready_before_the_first_due_job(
        redis_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    r = redis.Redis.from_url(redis_url)
    monkeypatch.setattr(marks, "_sync_client", None)
    r.script_flush()
    clients_before = len(r.client_list())
    client = marks.client()
    try:
        # The script is loaded and the connections opened: a worker thread's first job
        # sends its EVALSHA at once, on a connection of its own.
        assert r.script_exists(marks._sync_scripts["late"].sha) == [True]
        assert len(r.client_list()) - clients_before == marks.WARM_CONNECTIONS
        assert marks.client() is client
        due = (int(r.time()[0]) - 1) * 1_000_000
        marks.mark_late(due)
        late_us = int(r.lrange(marks.LATE_KEY, 0, -1)[0])
        assert 1_000_000 <= late_us < 60_000_000
    finally:
        client.close()
        client.connection_pool.disconnect()


def test_note_time_keeps_the_latest(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.set("t", 2**62)  # a time far in the future stays
    marks.note_time(r, "t")
    assert int(r.get("t")) == 2**62
    r.delete("t")
    marks.note_time(r, "t")
    seconds, _ = r.time()
    assert abs(int(r.get("t")) / 1e6 - seconds) < 5
