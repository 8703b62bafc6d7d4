"""Huey adapter (RedisHuey).

Idioms: calling the task enqueues it; ``task.schedule(args, eta=datetime)`` for delayed
jobs (the consumer moves them to its schedule and its scheduler checks it every second).
Huey has no bulk enqueue, so bulk is null. Worker: ``huey_consumer MODULE.huey -k thread
-w 8`` per process, the worker type Huey's docs recommend for I/O-bound tasks.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

from huey import RedisHuey

from bench.harness import marks, ops, processes

huey = RedisHuey("bench", url=os.environ.get(marks.URL_ENV, "redis://127.0.0.1:1/0"))
THREADS = 8


@huey.task()
def noop() -> None:
    marks.mark_done()


@huey.task()
def late(due_us: int) -> None:
    marks.mark_late(due_us)


def _enqueue_late(due_us: int) -> None:
    late.schedule(args=(due_us,), eta=ops.due_datetime(due_us))


def make() -> ops.Adapter:
    def preload_noop(n: int) -> None:
        for _ in range(n):
            noop()

    def preload_late(dues: list[int]) -> None:
        for due in dues:
            _enqueue_late(due)

    def start_workers(procs: int, scheduler: bool):
        consumer = os.path.join(os.path.dirname(sys.executable), "huey_consumer")
        return [
            processes.start_process(
                [consumer, "huey_bench.huey", "-k", "thread", "-w", str(THREADS), "-q"],
                f"huey-{i}",
            )
            for i in range(procs)
        ]

    return ops.Adapter(
        name="huey",
        versions=lambda: {"huey": version("huey"), "redis-py": version("redis")},
        enqueue_noop=lambda: noop(),
        bulk_noop=None,
        preload_noop=preload_noop,
        enqueue_late=_enqueue_late,
        preload_late=preload_late,
        start_workers=start_workers,
        notes={
            "bulk_api": None,
            "worker": f"huey_consumer -k thread -w {THREADS} per process",
            "delayed_api": "task.schedule(args, eta=datetime)",
            "storage": "a scheduled task waits in the queue list until a consumer moves it "
            "to the schedule sorted set; measured with no consumer running",
        },
    )

