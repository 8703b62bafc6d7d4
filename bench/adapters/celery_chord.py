"""Celery's chord on Redis, for ``bench.workflows`` (run with the peers' Python).

    BENCH_REDIS_URL=URL python -m celery_chord URL MEMBERS PROCS THREADS

A chord of MEMBERS no-op members and a callback, with Redis as broker and result
backend (Celery's native Redis chord: each member's result is counted in the backend
and the member that completes the count sends the callback). Workers: PROCS ``celery
worker --pool threads --concurrency THREADS`` processes, gossip, mingle and heartbeat
off, as the other Celery workloads run. Prints one JSON line: the time from the first
publish to the callback's start, the Redis time from the last member's finish to the
callback's start, and the Redis bytes per member while the chord waits (measured with
no worker running).
"""

from __future__ import annotations

import json
import os
import sys
import time

import redis
from celery import Celery, chord

from bench.harness import marks, processes

URL = os.environ.get(marks.URL_ENV, "redis://127.0.0.1:1/0")
app = Celery("celery_chord", broker=URL, backend=URL)
app.conf.update(task_default_queue="chord", worker_hijack_root_logger=False,
                broker_connection_retry_on_startup=True, result_expires=3600)
LAST_MEMBER_KEY = "bench:chord:last_member_us"
CALLBACK_KEY = "bench:chord:callback_us"
_client = redis.Redis.from_url(URL)


@app.task(name="chord.member")
def member(i: int) -> int:
    marks.note_time(_client, LAST_MEMBER_KEY)
    return i


@app.task(name="chord.callback")
def callback(results: list[int]) -> int:
    marks.note_time(_client, CALLBACK_KEY)
    return len(results)


def main() -> None:
    url, members, procs, threads = sys.argv[1], *map(int, sys.argv[2:5])
    client = redis.Redis.from_url(url)
    client.flushall()
    base = int(client.info("memory")["used_memory"])
    started = time.monotonic()
    chord(member.s(i) for i in range(members))(callback.s())
    published_s = time.monotonic() - started
    per_member = (int(client.info("memory")["used_memory"]) - base) / members
    celery_bin = os.path.join(os.path.dirname(sys.executable), "celery")
    workers = [processes.start_process(
        [celery_bin, "-A", "celery_chord", "worker", "--pool", "threads", "--concurrency",
         str(threads), "-Q", "chord", "--without-gossip", "--without-mingle",
         "--without-heartbeat", "-n", f"chord{i}@%h", "--loglevel", "WARNING"],
        f"celery-chord-{i}", {marks.URL_ENV: url}) for i in range(procs)]
    try:
        while not client.exists(CALLBACK_KEY):
            time.sleep(0.05)
    finally:
        processes.stop_processes(workers)
    total_s = time.monotonic() - started
    last, cb = int(client.get(LAST_MEMBER_KEY)), int(client.get(CALLBACK_KEY))
    print(json.dumps({"lib": "celery", "members": members, "enqueue_s": round(published_s, 3),
                      "total_s": round(total_s, 3), "release_ms": round((cb - last) / 1000, 2),
                      "bytes_per_member_waiting": round(per_member)}))


if __name__ == "__main__":
    main()
