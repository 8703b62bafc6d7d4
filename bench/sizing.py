"""Redis memory per job, per event and per queue, and the settings that bound each.

    python -m bench.sizing [--scale 1] [--jobs 5000] [--baseline DIR]

On a throwaway Redis (``--save "" --appendonly no``), through the engine's own calls as
a worker makes them, each figure is the growth of Redis's ``used_memory`` (or of the
stream's ``MEMORY USAGE``) over ``--jobs`` jobs, divided by them:

- ``waiting``: jobs enqueued one call each with a delay (scheduled), no events;
- ``ready``: the same, due at once;
- ``finished``: enqueued, claimed 16 at a time, completed with a short result (with its
  start time, as a worker acks it);
- ``failed``: the same, failed for good with a one-line error and a 1.5 KB traceback;
- ``event_single`` / ``event_bulk``: the events stream per job event, for jobs enqueued
  one call each and 1,000 a call (``enqueue_many``);
- ``queue``: one job finished in each of 200 queues, less 200 finished jobs: the keys a
  queue keeps (counters, sets, its stream);
- ``kept_after``: what stays after 4 x ``--jobs`` jobs finished with
  ``KEEP_COMPLETED`` = ``--jobs`` / 4, the figure a bound by count changes.

``--baseline DIR`` runs the same in another checkout of the project (its
``django_delayq`` imported from DIR), for a before/after of a change. Prints each figure
and writes ``sizing.json`` (in ``--out``); docs/sizing.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench import record

JOBS = 5_000
CLAIM = 16
QUEUES = 200
#: A worker's name as runworker makes it (host:pid:hex-thread), on a Kubernetes pod.
WORKER = "app-worker-7d9f8b6c5-x2x7k:4242:8002c3-0"
TRACEBACK = "Traceback (most recent call last):\n" + '  File "shop/tasks.py", line 12\n' * 40


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def measure(jobs: int) -> dict[str, Any]:
    """Every figure of the module docstring, with the django_delayq importable here."""
    from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
    from django_delayq.testing import RedisServer

    figures: dict[str, Any] = {"jobs": jobs}
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)

        def broker(**config: Any) -> Broker:
            client.flushall()
            return Broker(client, EngineConfig(**config))

        def enqueue(b: Broker, queue: str, n: int, **options: Any) -> None:
            for i in range(n):
                b.enqueue(queue, "shop.tasks.send_receipt", [i, "receipt"], **options)

        def finish(b: Broker, queue: str, n: int, *, fail: bool = False) -> None:
            left = n
            while left > 0:
                claimed = [j for r in b.claim(queue, min(CLAIM, left), WORKER) for j in r.jobs]
                started = int(time.time() * 1000)  # as a worker gives it with its ack
                batch = b.batch()
                if fail:
                    for j in claimed:
                        b.add_fail(batch, j.keys, j.id, j.attempt,
                                   "shop.errors.Declined: card declined", TRACEBACK, -1,
                                   started)
                else:
                    for keys in {j.keys for j in claimed}:
                        b.add_complete(batch, keys, [(j.id, j.attempt, '"sent"', started)
                                                     for j in claimed if j.keys == keys])
                batch.run()
                left -= len(claimed)

        quiet = {"events_maxlen": 0}
        for name, delay in (("waiting", 3600), ("ready", None)):
            b = broker(**quiet)
            start = _used(client)
            enqueue(b, "q", jobs, delay=delay)
            figures[name] = (_used(client) - start) / jobs
        for name, fail in (("finished", False), ("failed", True)):
            b = broker(**quiet)
            start = _used(client)
            enqueue(b, "q", jobs, max_attempts=1)
            finish(b, "q", jobs, fail=fail)
            figures[name] = (_used(client) - start) / jobs
        b = broker()
        enqueue(b, "q", jobs)
        events = b.shards("q")[0].events
        stream = int(client.execute_command("MEMORY", "USAGE", events, "SAMPLES", "0"))
        figures["event_single"] = stream / jobs
        b = broker()
        for _ in range(jobs // 1000 or 1):
            b.enqueue_many("q", [EnqueueRequest(task="shop.tasks.send_receipt", args=[i])
                                 for i in range(1000)], chunk_size=1000)
        stream = int(client.execute_command("MEMORY", "USAGE", events, "SAMPLES", "0"))
        figures["event_bulk"] = stream / ((jobs // 1000 or 1) * 1000)
        b = broker()
        start = _used(client)
        for q in range(QUEUES):
            enqueue(b, f"q{q}", 1, max_attempts=1)
            finish(b, f"q{q}", 1)
        figures["queue"] = (_used(client) - start) / QUEUES - figures["finished"]
        keep = max(1, jobs // 4)
        b = broker(keep_completed=keep, **quiet)
        start = _used(client)
        for _ in range(4):
            enqueue(b, "q", jobs, max_attempts=1)
            finish(b, "q", jobs)
        figures["kept_after"] = {"finished": 4 * jobs, "keep_completed": keep,
                                 "bytes": _used(client) - start,
                                 "job_records": sum(1 for _ in client.scan_iter(
                                     match=b.shards("q")[0].job_prefix + "*", count=1000))}
        figures["redis_version"] = client.info("server")["redis_version"]
        client.close()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"jobs per figure (default {JOBS:,} x scale)")
    parser.add_argument("--baseline", default=None,
                        help="another checkout of the project, measured the same way")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # jobs; JSON out
    opts = parser.parse_args(argv)
    if opts.child:
        print(json.dumps(measure(opts.child)))
        return
    run = record.Run("sizing", opts.scale)
    jobs = opts.jobs or record.scaled(JOBS, opts.scale, minimum=1000)
    figures: dict[str, Any] = {"this": measure(jobs)}
    if opts.baseline:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [os.path.abspath(opts.baseline), str(record.ROOT)])}
        # by path: the baseline may predate this file, and its django_delayq comes first
        done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                               str(jobs)], cwd=opts.baseline, env=env, capture_output=True,
                              text=True)
        if done.returncode:
            raise SystemExit(f"the baseline's run failed:\n{done.stderr}")
        figures["baseline"] = json.loads(done.stdout.strip().splitlines()[-1])
        figures["baseline_dir"] = opts.baseline
    print(json.dumps(figures, indent=2))
    print(f"wrote {run.write(opts.out, figures)}")


if __name__ == "__main__":
    main()
