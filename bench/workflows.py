"""Workflows: a group of N members with a callback, and what a waiting job costs.

    .venv/bin/python bench/workflows.py [--members 10000] [--procs 2] [--threads 8]

Starts a throwaway Redis and measures on it:

- ``release_ms``: Redis time from the last member's finish to the callback's start
  (the callback is released in the script that acks the last member; a worker then
  claims it), with ``--procs`` worker processes of ``--threads`` threads;
- ``total_s``: from the first member's enqueue to the callback's start;
- ``bytes_per_waiting``: Redis memory (``used_memory``) per job waiting for one parent,
  over ``--waiting`` such jobs, next to ``bytes_per_scheduled`` for as many plain
  scheduled jobs;
- ``bytes_per_member_waiting``: Redis memory per member of the enqueued group and its
  callback, before any worker runs.

With ``--celery PYTHON`` (a Python with Celery, as ``bench/.venv-peers/bin/python``),
Celery's chord runs the same workload on the same Redis afterwards
(``adapters/celery_chord.py``), and both lines are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ADAPTERS = Path(__file__).resolve().parent / "adapters"
sys.path.insert(0, str(ADAPTERS))
sys.path.insert(0, str(ADAPTERS.parent.parent))

from django_delayq.testing import RedisServer  # noqa: E402


def _memory(client) -> int:
    return int(client.info("memory")["used_memory"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--members", type=int, default=10_000)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--celery", help="a Python with Celery: run its chord too")
    opts = parser.parse_args()
    with RedisServer() as server:
        import common

        os.environ[common.URL_ENV] = server.url
        os.environ["DJANGO_SETTINGS_MODULE"] = "delayq_bench_settings"
        import django

        django.setup()
        from delayq_benchapp import tasks

        from django_delayq import Job, group
        from django_delayq.connection import get_broker
        from django_delayq.engine import EnqueueRequest

        client = get_broker().client
        # -- memory: N scheduled jobs, then N jobs waiting for one scheduled parent
        base = _memory(client)
        tasks.member.using(delay=3600).enqueue_many([i] for i in range(opts.waiting))
        scheduled = (_memory(client) - base) / opts.waiting
        client.flushall()
        parent = tasks.member.using(delay=3600).enqueue(0)
        base = _memory(client)
        get_broker().enqueue_many("bench", (
            EnqueueRequest(task=tasks.member.name, args=[i], depends_on=[parent])
            for i in range(opts.waiting)))
        waiting = (_memory(client) - base) / opts.waiting
        client.flushall()
        # -- a group of N members and its callback, run by worker processes
        base = _memory(client)
        started = time.monotonic()
        jobs = group(tasks.member.bind(i) for i in range(opts.members)).then(
            tasks.callback.bind()).enqueue()
        enqueued_s = time.monotonic() - started
        per_member = (_memory(client) - base) / opts.members
        os.environ["PYTHONPATH"] = str(ADAPTERS.parent.parent)  # this checkout's package
        procs = [common.start_process([sys.executable, "-m", "django", "runworker", "bench",
                                       "-c", str(opts.threads), "--no-mirror", "-v", "0"],
                                      f"delayq-flows-{i}") for i in range(opts.procs)]
        try:
            assert jobs.callback is not None
            while Job.fetch(jobs.callback.id, "bench").status != "completed":
                time.sleep(0.05)
        finally:
            common.stop_processes(procs)
        total_s = time.monotonic() - started
        last = int(client.get(tasks.LAST_MEMBER_KEY))
        callback = int(client.get(tasks.CALLBACK_KEY))
        print(json.dumps({
            "lib": "django-delayq", "members": opts.members, "procs": opts.procs,
            "threads": opts.threads,
            "enqueue_s": round(enqueued_s, 3), "total_s": round(total_s, 3),
            "release_ms": round((callback - last) / 1000, 2),
            "bytes_per_member_waiting": round(per_member),
            "bytes_per_waiting": round(waiting), "bytes_per_scheduled": round(scheduled),
        }))
        if opts.celery:
            subprocess.run([opts.celery, str(ADAPTERS / "celery_chord.py"), server.url,
                            str(opts.members), str(opts.procs), str(opts.threads)],
                           cwd=ADAPTERS, check=True,
                           env={k: v for k, v in os.environ.items()
                                if k != "DJANGO_SETTINGS_MODULE"})


if __name__ == "__main__":
    main()
