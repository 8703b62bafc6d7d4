"""django-delayq adapter, run with the project's interpreter.

Idioms: ``noop.enqueue()`` (the public ``@task`` API, one Lua call); delayed jobs with
``late.using(run_at=datetime).enqueue(due)``; bulk with ``Task.enqueue_many`` (one Lua
call per chunk of 1,000). Worker: ``django-admin runworker bench --concurrency 8``, one
process each, threads as the other threaded peers; ``--no-mirror`` because no
peer writes a database (the mirror can run as its own ``delayq_mirror`` process).

Other ways to start the workers of a processing run (``variants``): ``pool``, one
``runworker --processes N`` (a supervisor and N children) in place of N separate
processes; ``timeout``, each process with ``--timeout 60``; ``defaults``, one
``runworker`` as the library starts it with nothing set (its threads, its model
mirror, a fresh SQLite database, its log line per job); ``defaults_no_mirror``, the same
with ``--no-mirror``; ``async``, the tuned worker on a backlog of the no-op job written as
an ``async def`` task (run on the worker's event loop).
"""

from __future__ import annotations

import functools
import os
import sys
from importlib.metadata import version
from pathlib import Path

from bench.harness import ops, processes

SETTINGS = "delayq_bench_settings"
THREADS = 8
TIMEOUT_S = 60
# As every peer worker is run: warnings only, no log line per job.
QUIET = ["--verbosity", "0"]


def runworker(*args: str) -> list[str]:
    return [sys.executable, "-m", "django", "runworker", *args, "--settings", SETTINGS]


def worker_argv(variant: str | None, procs: int) -> tuple[list[str], int]:
    """The command line of a processing run's workers, and how many to start."""
    # The peers have no database mirror; it can run as its own process.
    tuned = ["bench", "--concurrency", str(THREADS), "--no-mirror", *QUIET]
    if variant is None:
        return runworker(*tuned), procs
    if variant == "timeout":
        return runworker(*tuned, "--timeout", str(TIMEOUT_S)), procs
    if variant == "pool":
        return runworker(*tuned, "--processes", str(procs)), 1
    if variant == "defaults":
        return runworker(), 1
    if variant == "defaults_no_mirror":
        return runworker("--no-mirror"), 1
    if variant == "async":
        return runworker("bench_async", *tuned[1:]), procs
    if variant == "unsupervised":
        return unsupervised(), procs
    raise ValueError(f"no worker variant {variant!r}")


def unsupervised() -> list[str]:
    """A worker process as ``runworker``'s host starts it, with no host and no board: what
    the tuned worker would cost if nothing watched it (the supervision row)."""
    from django_delayq.worker.process import ProcessSpec, command

    spec = ProcessSpec(queues=["bench"], host="bench", host_pid=os.getpid(), verbosity=0,
                       options={"concurrency": THREADS, "name": f"bench-{os.urandom(3).hex()}"})
    return command(spec)[0]


VARIANTS = ("pool", "timeout", "defaults", "defaults_no_mirror", "async", "unsupervised")


def make() -> ops.Adapter:
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    import django

    django.setup()
    from delayq_benchapp.tasks import anoop, late, noop

    from django_delayq.connection import get_broker
    from django_delayq.engine import EnqueueRequest
    from django_delayq.mirror import GROUP

    broker = get_broker()

    def bulk_noop(n: int) -> None:
        noop.enqueue_many([()] * n)

    def preload_late(dues: list[int]) -> None:
        broker.enqueue_many(
            late.queue_name,
            (EnqueueRequest(task=late.name, args=[d], run_at=ops.due_datetime(d)) for d in dues),
        )

    def start(variant: str | None, procs: int) -> ops.Workers:
        if variant in ("defaults", "defaults_no_mirror"):
            fresh_database()
        argv, count = worker_argv(variant, procs)
        name = f"delayq-{variant}" if variant else "delayq"
        env = {"DJANGO_SETTINGS_MODULE": SETTINGS}
        return [processes.start_process(argv, f"{name}-{i}", env) for i in range(count)]

    def settled() -> bool:
        """Every event of the bench queue read and acknowledged by the model mirror."""
        for keys in broker.shards(noop.queue_name):
            stream = broker.client.xinfo_stream(keys.events)
            groups = {_text(g["name"]): g for g in broker.client.xinfo_groups(keys.events)}
            group = groups.get(GROUP)
            if group is None or group["pending"] or (
                    group["last-delivered-id"] != stream["last-generated-id"]):
                return False
        return True

    return ops.Adapter(
        name="django_delayq",
        versions=lambda: {
            "django-delayq": version("django-delayq"),
            "django": version("django"),
            "redis-py": version("redis"),
        },
        enqueue_noop=lambda: noop.enqueue(),
        bulk_noop=bulk_noop,
        preload_noop=bulk_noop,
        enqueue_late=lambda due: late.using(run_at=ops.due_datetime(due)).enqueue(due),
        preload_late=preload_late,
        start_workers=lambda procs, scheduler: start(None, procs),
        variants={variant: functools.partial(start, variant) for variant in VARIANTS},
        variant_preloads={"async": lambda n: anoop.enqueue_many([()] * n)},
        settled=settled,
        notes={
            "bulk_api": "Task.enqueue_many (one Lua call per chunk of 1,000)",
            "worker": f"runworker bench --concurrency {THREADS} --no-mirror -v 0, one process each "
            "(the model mirror can run on its own as delayq_mirror)",
            "delayed_api": "task.using(run_at=datetime).enqueue(...)",
        },
    )


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def fresh_database() -> None:
    """An empty, migrated SQLite database for the model mirror of a defaults run."""
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    name = Path(connections["default"].settings_dict["NAME"])
    for path in (name, Path(f"{name}-wal"), Path(f"{name}-shm"), Path(f"{name}-journal")):
        path.unlink(missing_ok=True)
    name.parent.mkdir(parents=True, exist_ok=True)
    call_command("migrate", verbosity=0)
    connections.close_all()

