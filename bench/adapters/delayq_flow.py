"""django-delayq's group and callback, for ``bench.workflows`` (the project's Python).

    python -m delayq_flow URL MEMBERS WAITING PROCS THREADS

Measures on the (flushed) Redis at URL and prints one JSON line:

- ``bytes_per_scheduled``, ``bytes_per_waiting``: Redis memory (``used_memory``) per
  plain scheduled job, and per job waiting for one parent, over WAITING of each;
- ``bytes_per_member_waiting``: per member of the enqueued group and its callback,
  before any worker runs;
- ``enqueue_s``, ``total_s``: the group's enqueue, and from it to the callback's end;
- ``release_ms``: Redis time from the last member's finish to the callback's start
  (the callback is released in the script that acks the last member; a worker then
  claims it), with PROCS worker processes of THREADS threads (``--no-mirror``, as every
  processing row).
"""

from __future__ import annotations

import json
import os
import sys
import time

from bench.harness import marks, processes


def _memory(client) -> int:
    return int(client.info("memory")["used_memory"])


def main(url: str, members: int, waiting_n: int, procs_n: int, threads: int) -> None:
    os.environ[marks.URL_ENV] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "delayq_bench_settings"
    import django

    django.setup()
    from delayq_benchapp import tasks

    from django_delayq import Job, group
    from django_delayq.connection import get_broker
    from django_delayq.engine import EnqueueRequest

    client = get_broker().client
    client.flushall()
    # -- memory: N scheduled jobs, then N jobs waiting for one scheduled parent
    base = _memory(client)
    tasks.member.using(delay=3600).enqueue_many([i] for i in range(waiting_n))
    scheduled = (_memory(client) - base) / waiting_n
    client.flushall()
    parent = tasks.member.using(delay=3600).enqueue(0)
    base = _memory(client)
    get_broker().enqueue_many("bench", (
        EnqueueRequest(task=tasks.member.name, args=[i], depends_on=[parent])
        for i in range(waiting_n)))
    waiting = (_memory(client) - base) / waiting_n
    client.flushall()
    # -- a group of N members and its callback, run by worker processes
    base = _memory(client)
    started = time.monotonic()
    jobs = group(tasks.member.bind(i) for i in range(members)).then(
        tasks.callback.bind()).enqueue()
    enqueued_s = time.monotonic() - started
    per_member = (_memory(client) - base) / members
    workers = [processes.start_process(
        [sys.executable, "-m", "django", "runworker", "bench", "-c", str(threads),
         "--no-mirror", "-v", "0"], f"delayq-flows-{i}") for i in range(procs_n)]
    try:
        assert jobs.callback is not None
        while Job.fetch(jobs.callback.id, "bench").status != "completed":
            if any(w.poll() is not None for w in workers):
                raise RuntimeError("a worker exited before the callback ran")
            time.sleep(0.05)
    finally:
        processes.stop_processes(workers)
    total_s = time.monotonic() - started
    last = int(client.get(tasks.LAST_MEMBER_KEY))
    callback = int(client.get(tasks.CALLBACK_KEY))
    print(json.dumps({
        "lib": "django-delayq", "members": members, "procs": procs_n, "threads": threads,
        "enqueue_s": round(enqueued_s, 3), "total_s": round(total_s, 3),
        "release_ms": round((callback - last) / 1000, 2),
        "bytes_per_member_waiting": round(per_member),
        "bytes_per_waiting": round(waiting), "bytes_per_scheduled": round(scheduled),
    }))


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:6]))
