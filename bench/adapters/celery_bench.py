"""Celery adapter (Redis broker, no result backend).

Idioms: ``task.delay()`` one call at a time; ``apply_async(eta=...)`` for delayed jobs
(Celery keeps the ETA in the message; a worker holds it in memory until due); bulk is
``group(...).apply_async()``, the canvas primitive Celery documents for sending many
tasks at once (one producer, one publish per task: Celery has no pipelined send).
Worker: ``celery worker --pool threads --concurrency 8`` per process, with gossip,
mingle and heartbeat off (the settings Celery's docs suggest for fast start-up of
simple deployments); results are ignored because the jobs return nothing.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import version

from celery import Celery, group

from bench.harness import marks, ops, processes

app = Celery("celery_bench", broker=os.environ.get(marks.URL_ENV, "redis://127.0.0.1:1/0"))
app.conf.update(
    task_ignore_result=True,
    task_default_queue="bench",
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=True,
)
THREADS = 8


@app.task(name="bench.noop")
def noop() -> None:
    marks.mark_done()


@app.task(name="bench.late")
def late(due_us: int) -> None:
    marks.mark_late(due_us)


def make() -> ops.Adapter:
    def bulk_noop(n: int) -> None:
        for size in ops.chunks(n):
            group(noop.s() for _ in range(size)).apply_async()

    def preload_late(dues: list[int]) -> None:
        # Untimed backlog for the storage workload. Celery publishes one LPUSH per task
        # on a fresh redis-py client, about 1 ms each: 200,000 would take minutes. The
        # messages are built by Celery's own apply_async; only kombu's final LPUSH is
        # queued on a pipeline, so Redis holds exactly the bytes a plain publish leaves.
        with app.producer_or_acquire() as producer:
            channel = producer.channel
            client = channel._create_client()
            put = channel._put

            def pipelined_put(*args, **kwargs):
                channel._create_client = lambda *a, **k: pipe
                try:
                    return put(*args, **kwargs)
                finally:
                    del channel._create_client

            channel._put = pipelined_put
            try:
                for i in range(0, len(dues), 1000):
                    pipe = client.pipeline(transaction=False)
                    for d in dues[i : i + 1000]:
                        late.apply_async((d,), eta=ops.due_datetime(d), producer=producer)
                    pipe.execute()
            finally:
                del channel._put

    def start_workers(procs: int, scheduler: bool):
        celery_bin = os.path.join(os.path.dirname(sys.executable), "celery")
        return [
            processes.start_process(
                [
                    celery_bin,
                    "-A",
                    "celery_bench",
                    "worker",
                    "-Q",
                    "bench",
                    "--pool",
                    "threads",
                    "--concurrency",
                    str(THREADS),
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "-n",
                    f"bench{i}@%h",
                    "--loglevel",
                    "WARNING",
                ],
                f"celery-{i}",
            )
            for i in range(procs)
        ]

    return ops.Adapter(
        name="celery",
        versions=lambda: {
            "celery": version("celery"),
            "kombu": version("kombu"),
            "redis-py": version("redis"),
        },
        enqueue_noop=lambda: noop.delay(),
        bulk_noop=bulk_noop,
        preload_noop=bulk_noop,
        enqueue_late=lambda due: late.apply_async((due,), eta=ops.due_datetime(due)),
        preload_late=preload_late,
        start_workers=start_workers,
        notes={
            "bulk_api": "group(task.s() ...).apply_async() in chunks of 1,000 "
            "(one publish per task)",
            "worker": f"celery worker --pool threads --concurrency {THREADS} per process, "
            "--without-gossip --without-mingle --without-heartbeat, results ignored",
            "delayed_api": "apply_async(eta=datetime); the worker holds ETA jobs in memory",
            "storage": "delayed jobs are plain broker messages until a worker prefetches them",
        },
    )

