"""Dramatiq adapter (RedisBroker).

Idioms: ``actor.send()`` one call at a time; ``send_with_options(delay=ms)`` for delayed
jobs (Dramatiq's only delay API: a relative delay, kept in the ``.DQ`` queue and then in
the worker's memory until due). Dramatiq has no bulk enqueue (``group`` sends one
message at a time), so bulk is null. Worker: ``dramatiq MODULE --processes P --threads 8``,
the CLI's default thread count.
"""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import version

import dramatiq
from dramatiq.brokers.redis import RedisBroker

from bench.harness import marks, ops, processes

broker = RedisBroker(url=os.environ.get(marks.URL_ENV, "redis://127.0.0.1:1/0"))
dramatiq.set_broker(broker)
THREADS = 8


@dramatiq.actor(queue_name="bench", max_retries=0)
def noop() -> None:
    marks.mark_done()


@dramatiq.actor(queue_name="bench", max_retries=0)
def late(due_us: int) -> None:
    marks.mark_late(due_us)


def _enqueue_late(due_us: int) -> None:
    delay_ms = max(0, int(due_us / 1000 - time.time() * 1000))
    late.send_with_options(args=(due_us,), delay=delay_ms)


def make() -> ops.Adapter:
    def preload_noop(n: int) -> None:
        for _ in range(n):
            noop.send()

    def preload_late(dues: list[int]) -> None:
        for due in dues:
            _enqueue_late(due)

    def start_workers(procs: int, scheduler: bool):
        dramatiq_bin = os.path.join(os.path.dirname(sys.executable), "dramatiq")
        return [
            processes.start_process(
                [
                    dramatiq_bin,
                    "dramatiq_bench",
                    "--processes",
                    str(procs),
                    "--threads",
                    str(THREADS),
                    "--queues",
                    "bench",
                ],
                "dramatiq",
            )
        ]

    return ops.Adapter(
        name="dramatiq",
        versions=lambda: {"dramatiq": version("dramatiq"), "redis-py": version("redis")},
        enqueue_noop=lambda: noop.send(),
        bulk_noop=None,
        preload_noop=preload_noop,
        enqueue_late=_enqueue_late,
        preload_late=preload_late,
        start_workers=start_workers,
        notes={
            "bulk_api": None,
            "worker": f"dramatiq --processes P --threads {THREADS}",
            "delayed_api": "send_with_options(delay=ms), the delay computed from the due time",
            "storage": "delayed messages wait in the .DQ queue until a worker prefetches them",
        },
    )

