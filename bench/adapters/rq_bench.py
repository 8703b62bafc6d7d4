"""RQ adapter: the jobs, the enqueue calls and the worker command RQ's docs give.

Idioms: ``Queue.enqueue`` / ``Queue.enqueue_at`` one call at a time; ``Queue.enqueue_many``
with ``Queue.prepare_data`` for bulk (docs: "Bulk Job Enqueueing"); ``rq worker`` with
``SimpleWorker`` (RQ's docs/benchmark.md: about 6x faster than the forking default for
short jobs), one process per worker; ``--with-scheduler`` runs the built-in scheduler
that moves due ``enqueue_at`` jobs onto the queue.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

from bench.harness import marks, ops, processes

QUEUE = "bench"


def noop() -> None:
    marks.mark_done()


def late(due_us: int) -> None:
    marks.mark_late(due_us)


def make() -> ops.Adapter:
    import redis
    from rq import Queue

    conn = redis.Redis.from_url(marks.redis_url())
    q = Queue(QUEUE, connection=conn)

    def enqueue_noop() -> None:
        q.enqueue(noop)

    def bulk_noop(n: int) -> None:
        for size in ops.chunks(n):
            q.enqueue_many([Queue.prepare_data(noop) for _ in range(size)])

    def enqueue_late(due_us: int) -> None:
        q.enqueue_at(ops.due_datetime(due_us), late, due_us)

    def preload_late(dues: list[int]) -> None:
        for i in range(0, len(dues), 1000):
            with conn.pipeline() as pipe:
                for due in dues[i : i + 1000]:
                    q.enqueue_at(ops.due_datetime(due), late, due, pipeline=pipe)
                pipe.execute()

    def start_workers(procs: int, scheduler: bool):
        rq_bin = os.path.join(os.path.dirname(sys.executable), "rq")
        argv = [rq_bin, "worker", "-w", "rq.worker.SimpleWorker", "-u", marks.redis_url(), "-q"]
        if scheduler:
            argv.append("--with-scheduler")
        return [processes.start_process([*argv, QUEUE], f"rq-{i}") for i in range(procs)]

    return ops.Adapter(
        name="rq",
        versions=lambda: {"rq": version("rq"), "redis-py": version("redis")},
        enqueue_noop=enqueue_noop,
        bulk_noop=bulk_noop,
        preload_noop=bulk_noop,
        enqueue_late=enqueue_late,
        preload_late=preload_late,
        start_workers=start_workers,
        notes={
            "bulk_api": "Queue.enqueue_many(Queue.prepare_data(...)) in chunks of 1,000",
            "worker": "rq worker -w rq.worker.SimpleWorker (one process each), "
            "--with-scheduler for delayed jobs",
            "delayed_api": "Queue.enqueue_at(datetime, ...)",
        },
    )

