"""arq adapter.

Idioms: ``await pool.enqueue_job(name)`` one call at a time; ``_defer_until=datetime``
for delayed jobs (one sorted set holds immediate and delayed jobs, workers poll it every
``poll_delay`` = 0.5 s). arq has no bulk enqueue, so bulk is null (backlogs are preloaded
with concurrent ``enqueue_job`` calls). Worker: ``arq MODULE.WorkerSettings`` with its
defaults (``max_jobs`` = 10), one process each.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from importlib.metadata import version

from arq.connections import RedisSettings, create_pool

from bench.harness import marks, ops, processes


async def noop(ctx) -> None:
    await marks.async_marks().done()


async def late(ctx, due_us: int) -> None:
    await marks.async_marks().late(due_us)


async def quiet_logs(ctx) -> None:
    # Warnings only, as every peer worker is run: arq's CLI logs two lines per job.
    logging.getLogger("arq").setLevel(logging.WARNING)


class WorkerSettings:
    functions = [noop, late]
    on_startup = quiet_logs
    redis_settings = RedisSettings.from_dsn(os.environ.get(marks.URL_ENV, "redis://127.0.0.1:1/0"))


def make() -> ops.Adapter:
    loop = asyncio.new_event_loop()
    pool = loop.run_until_complete(create_pool(RedisSettings.from_dsn(marks.redis_url())))
    run = loop.run_until_complete

    def enqueue_late_async(due: int):
        return pool.enqueue_job("late", due, _defer_until=ops.due_datetime(due))

    def preload_noop(n: int) -> None:
        async def go() -> None:
            for size in ops.chunks(n):
                await asyncio.gather(*(pool.enqueue_job("noop") for _ in range(size)))

        run(go())

    def preload_late(dues: list[int]) -> None:
        async def go() -> None:
            for i in range(0, len(dues), 1000):
                await asyncio.gather(*(enqueue_late_async(d) for d in dues[i : i + 1000]))

        run(go())

    def start_workers(procs: int, scheduler: bool):
        arq_bin = os.path.join(os.path.dirname(sys.executable), "arq")
        return [
            processes.start_process([arq_bin, "arq_bench.WorkerSettings"], f"arq-{i}")
            for i in range(procs)
        ]

    def close() -> None:
        run(pool.aclose())
        loop.close()

    return ops.Adapter(
        name="arq",
        versions=lambda: {"arq": version("arq"), "redis-py": version("redis")},
        enqueue_noop=lambda: run(pool.enqueue_job("noop")),
        bulk_noop=None,
        preload_noop=preload_noop,
        enqueue_late=lambda due: run(enqueue_late_async(due)),
        preload_late=preload_late,
        start_workers=start_workers,
        notes={
            "bulk_api": None,
            "worker": "arq WorkerSettings, defaults (max_jobs=10, poll_delay=0.5 s), log level "
            "WARNING, "
            "one process each",
            "delayed_api": "enqueue_job(..., _defer_until=datetime)",
        },
        close=close,
    )

