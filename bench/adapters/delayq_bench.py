"""django-delayq adapter, run with the project's interpreter.

Idioms: ``noop.enqueue()`` (the public ``@task`` API, one Lua call); delayed jobs with
``late.using(run_at=datetime).enqueue(due)``; bulk with ``Task.enqueue_many`` (one Lua
call per chunk of 1,000). Worker: ``django-admin runworker bench --concurrency 8``, one
process each, threads as the other threaded peers; ``--no-mirror`` because no
peer writes a database (the mirror can run as its own ``delayq_mirror`` process).
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

import common

SETTINGS = "delayq_bench_settings"
THREADS = 8


def make() -> common.Adapter:
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django

    django.setup()
    from delayq_benchapp.tasks import late, noop

    from django_delayq.connection import get_broker
    from django_delayq.engine.broker import EnqueueRequest

    broker = get_broker()

    def bulk_noop(n: int) -> None:
        noop.enqueue_many([()] * n)

    def preload_late(dues: list[int]) -> None:
        broker.enqueue_many(
            late.queue_name,
            (EnqueueRequest(task=late.name, args=[d], run_at=common.due_datetime(d)) for d in dues),
        )

    def start_workers(procs: int, scheduler: bool):
        argv = [
            sys.executable,
            "-m",
            "django",
            "runworker",
            "bench",
            "--concurrency",
            str(THREADS),
            "--settings",
            SETTINGS,
            # The peers have no database mirror; it can run as its own process.
            "--no-mirror",
            # Warnings only, as every peer worker is run: no log line per job.
            "--verbosity",
            "0",
        ]
        return [common.start_process(argv, f"delayq-{i}") for i in range(procs)]

    return common.Adapter(
        name="django_delayq",
        versions=lambda: {
            "django-delayq": version("django-delayq"),
            "django": version("django"),
            "redis-py": version("redis"),
        },
        enqueue_noop=lambda: noop.enqueue(),
        bulk_noop=bulk_noop,
        preload_noop=bulk_noop,
        enqueue_late=lambda due: late.using(run_at=common.due_datetime(due)).enqueue(due),
        preload_late=preload_late,
        start_workers=start_workers,
        notes={
            "bulk_api": "Task.enqueue_many (one Lua call per chunk of 1,000)",
            "worker": f"runworker bench --concurrency {THREADS} --no-mirror -v 0, one process each "
            "(the model mirror can run on its own as delayq_mirror)",
            "delayed_api": "task.using(run_at=datetime).enqueue(...)",
        },
    )


if __name__ == "__main__":
    import delayq_bench

    common.main(delayq_bench.make)
