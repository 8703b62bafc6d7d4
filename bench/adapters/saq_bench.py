"""SAQ adapter (Redis queue).

Idioms: ``await queue.enqueue(name)`` one call at a time; ``scheduled=epoch seconds`` for
delayed jobs (promoted by the worker's schedule timer, every second by default). SAQ's
many-jobs API is ``Queue.map``, which enqueues with ``asyncio.gather`` and then waits for
the results; bulk here is that enqueue step alone, in chunks of 1,000. Worker:
``saq MODULE.settings --workers P`` with the default concurrency of 10.
"""

from __future__ import annotations

import asyncio
import os
import sys
from importlib.metadata import version

from saq import Queue

from bench.harness import marks, ops, processes


async def noop(ctx) -> None:
    await marks.async_marks().done()


async def late(ctx, *, due_us: int) -> None:
    await marks.async_marks().late(due_us)


queue = Queue.from_url(os.environ.get(marks.URL_ENV, "redis://127.0.0.1:1/0"), name="bench")
settings = {"queue": queue, "functions": [noop, late], "concurrency": 10}


def make() -> ops.Adapter:
    loop = asyncio.new_event_loop()
    q = Queue.from_url(marks.redis_url(), name="bench")
    run = loop.run_until_complete
    run(q.connect())

    async def gather_noop(n: int) -> None:
        for size in ops.chunks(n):
            await asyncio.gather(*(q.enqueue("noop") for _ in range(size)))

    def preload_late(dues: list[int]) -> None:
        async def go() -> None:
            for i in range(0, len(dues), 1000):
                await asyncio.gather(
                    *(q.enqueue("late", due_us=d, scheduled=d / 1e6) for d in dues[i : i + 1000])
                )

        run(go())

    def start_workers(procs: int, scheduler: bool):
        saq_bin = os.path.join(os.path.dirname(sys.executable), "saq")
        return [
            processes.start_process(
                [saq_bin, "saq_bench.settings", "--workers", str(procs), "--quiet"], "saq"
            )
        ]

    def close() -> None:
        run(q.disconnect())
        loop.close()

    return ops.Adapter(
        name="saq",
        versions=lambda: {"saq": version("saq"), "redis-py": version("redis")},
        enqueue_noop=lambda: run(q.enqueue("noop")),
        bulk_noop=lambda n: run(gather_noop(n)),
        preload_noop=lambda n: run(gather_noop(n)),
        enqueue_late=lambda due: run(q.enqueue("late", due_us=due, scheduled=due / 1e6)),
        preload_late=preload_late,
        start_workers=start_workers,
        notes={
            "bulk_api": "asyncio.gather(queue.enqueue(...)) in chunks of 1,000 "
            "(the enqueue step of Queue.map)",
            "worker": "saq settings --workers P, concurrency 10",
            "delayed_api": "queue.enqueue(..., scheduled=epoch seconds as a float)",
        },
        close=close,
    )

