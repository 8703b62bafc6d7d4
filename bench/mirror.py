"""The model mirror's cost: CPU per job of ``Mirror.run(burst=True)``, SQLite and PostgreSQL.

    python -m bench.mirror [--scale 1] [--jobs 20000] [--claim 16] [--backends sqlite,postgresql]

For each backend, in a process of its own (Django is configured once per process) with a
fresh migrated database (a SQLite file; a database of a throwaway PostgreSQL, or of the
server ``DELAYQ_BENCH_PG`` names as ``host:port:user``) and a throwaway Redis, it fills
an events stream through the engine's own calls, as a worker would: ``--jobs`` no-op
jobs enqueued one call each, then claimed, started and completed ``--claim`` at a time
(one entry per call). It then times three runs of the mirror, each a fresh
``Mirror.run(burst=True)`` in the measuring process:

- ``backlog``: every event of the finished jobs, mirrored at once (a mirror that was
  stopped, or lags behind): about one row write per job;
- ``replay``: the same events delivered again (the group's position reset to 0, as a
  takeover or a restart does): nothing to change;
- ``in_step``: another ``--jobs`` jobs, mirrored after each stage (enqueued; claimed and
  started; completed), as a mirror that keeps up does: about three row writes per job;
- ``trimmed``: another ``--jobs`` finished jobs whose hashes are gone before the mirror
  runs (as ``KEEP_COMPLETED`` trims them when a mirror lags further behind): each row
  built from its events alone.

Each reports the mirror's CPU (user + system, ``time.process_time``) per job, per stream
entry and per job event, its wall time, the Redis server's CPU (``INFO cpu``) and, on
PostgreSQL, the CPU of the server process serving the mirror's connection (``/proc``),
all per job. Prints each figure and writes ``mirror.json`` (in ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import record

JOBS = 20_000
CLAIM = 16
BACKENDS = ("sqlite", "postgresql")
TASK = "bench.noop"
#: The figure ``bench.tables`` shows first, and docs/mirror.md quotes.
HEADLINE = "backlog"


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"jobs per run (default {JOBS:,} x scale)")
    parser.add_argument("--claim", type=int, default=CLAIM,
                        help="jobs per claim, start and ack call (one stream entry each)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated, of: " + ", ".join(BACKENDS))
    parser.add_argument("--child", help=argparse.SUPPRESS)  # one backend, JSON settings
    opts = parser.parse_args(argv)
    if opts.child:
        print(json.dumps(measure(json.loads(opts.child))))
        return
    jobs = opts.jobs or record.scaled(JOBS, opts.scale, 100)
    backends = [b for b in opts.backends.split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends: {', '.join(sorted(unknown))}")
    this_run = record.Run("mirror", opts.scale)
    figures: dict[str, Any] = {"jobs": jobs, "claim": opts.claim, "backends": {}}
    for backend in backends:
        with database(backend) as db:
            figures["backends"][backend] = run_child(
                {"backend": backend, "database": db, "jobs": jobs, "claim": opts.claim})
    this_run.write(opts.out, figures)


@contextlib.contextmanager
def database(backend: str) -> Iterator[dict[str, Any]]:
    """Django's ``DATABASES["default"]`` for a fresh database of ``backend``, removed after."""
    if backend == "sqlite":
        with tempfile.TemporaryDirectory(prefix="delayq-bench-mirror-") as tmp:
            yield {"ENGINE": "django.db.backends.sqlite3", "NAME": str(Path(tmp) / "db.sqlite3")}
        return
    from bench.outbox import admin_connection, postgres

    name = f"delayq_bench_mirror_{uuid.uuid4().hex[:8]}"
    with postgres() as pg:
        host, port, user = pg.split(":")
        with admin_connection(pg) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield {"ENGINE": "django.db.backends.postgresql", "HOST": host, "PORT": port,
                   "USER": user, "NAME": name}
        finally:
            with admin_connection(pg) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "bench.mirror", "--child", json.dumps(spec)],
                          cwd=record.ROOT, capture_output=True, text=True, check=False,
                          env={k: v for k, v in os.environ.items()
                               if k != "DJANGO_SETTINGS_MODULE"})
    sys.stderr.write(done.stderr)
    if done.returncode:
        raise SystemExit(f"bench.mirror on {spec['backend']} failed ({done.returncode})")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    for label, run in figures["runs"].items():
        print(f"{spec['backend']:<10} {label:<8} {run['jobs']:>7,} jobs "
              f"{run['entries']:>7,} entries  mirror {run['cpu_us_per_job']:7.1f} us/job "
              f"{run['cpu_us_per_entry']:7.1f} us/entry  {run['jobs_per_s']:9,.0f} jobs/s  "
              f"Redis {run['redis_cpu_us_per_job']:5.1f} us/job  database "
              f"{record_or_na(run['database_cpu_us_per_job'])} us/job  load "
              f"{run['load'][0]:.2f}", file=sys.stderr)
    return figures


def record_or_na(value: float | None) -> str:
    return "  n/a" if value is None else f"{value:5.1f}"


# -- the measuring process ------------------------------------------------------------


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    from django_delayq.testing import RedisServer

    with RedisServer() as server:
        configure(spec["database"], server.url)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        return {"database_version": database_version(),
                "runs": runs(spec["jobs"], spec["claim"])}


def configure(database: dict[str, Any], redis_url: str) -> None:
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_delayq"],
        DATABASES={"default": database}, USE_TZ=True, LOGGING_CONFIG=None,
        DELAYQ={"REDIS_URL": redis_url},
    )
    django.setup()


def database_version() -> str:
    from django.db import connection

    connection.ensure_connection()
    if connection.vendor == "sqlite":
        import sqlite3

        return f"SQLite {sqlite3.sqlite_version}"
    version = connection.pg_version  # type: ignore[attr-defined]  # e.g. 150020
    return f"PostgreSQL {version // 10000}.{version % 10000}"


def runs(jobs: int, claim: int) -> dict[str, Any]:
    from django_delayq.connection import get_broker
    from django_delayq.mirror import GROUP

    broker = get_broker()
    figures: dict[str, Any] = {}
    stages = Stages(broker, "backlog", jobs, claim)
    stages.enqueue()
    stages.claim_and_start()
    stages.complete()
    meter = Meter(broker.client)
    with meter.measuring():
        burst(stages.queue)
    figures["backlog"] = meter.figures(stages)
    broker.client.xgroup_setid(stages.keys.events, GROUP, "0")  # every event delivered again
    meter = Meter(broker.client)
    with meter.measuring():
        burst(stages.queue)
    figures["replay"] = meter.figures(stages)
    stages, meter = Stages(broker, "in_step", jobs, claim), Meter(broker.client)
    for stage in (stages.enqueue, stages.claim_and_start, stages.complete):
        stage()
        with meter.measuring():
            burst(stages.queue)
    figures["in_step"] = meter.figures(stages)
    stages, meter = Stages(broker, "trimmed", jobs, claim), Meter(broker.client)
    stages.enqueue()
    stages.claim_and_start()
    stages.complete()
    stages.trim()
    with meter.measuring():
        burst(stages.queue)
    figures["trimmed"] = meter.figures(stages)
    return figures


class Stages:
    """The events of ``jobs`` no-op jobs on their own queue, written stage by stage
    through the engine, as a worker claiming ``claim`` at a time would write them."""

    def __init__(self, broker: Any, queue: str, jobs: int, claim: int) -> None:
        self.broker, self.queue, self.jobs, self.claim = broker, queue, jobs, claim
        (self.keys,) = broker.shards(queue)
        self.claimed: list[list[Any]] = []
        burst(queue)  # the group made, the first prune done: not part of any figure

    def enqueue(self) -> None:
        for i in range(self.jobs):
            self.broker.enqueue(self.queue, TASK, [i])

    def claim_and_start(self) -> None:
        while True:
            (result,) = self.broker.claim(self.queue, self.claim, "bench-worker")
            if not result.jobs:
                return
            batch = self.broker.batch()
            now_ms = int(time.time() * 1000)
            self.broker.add_start(batch, self.keys, "bench-worker",
                                  [(job.id, job.attempt, now_ms) for job in result.jobs])
            batch.run()
            self.claimed.append(result.jobs)

    def complete(self) -> None:
        for jobs in self.claimed:
            batch = self.broker.batch()
            self.broker.add_complete(batch, self.keys,
                                     [(job.id, job.attempt, "null") for job in jobs])
            batch.run()
        self.claimed = []

    def trim(self) -> None:
        """Delete the hashes of the finished jobs that ``KEEP_COMPLETED`` left."""
        client = self.broker.client
        while ids := client.zrange(self.keys.completed, 0, 999):
            client.delete(*(self.keys.job(job_id) for job_id in ids))
            client.zrem(self.keys.completed, *ids)

    def entries(self) -> int:
        return int(self.broker.client.xlen(self.keys.events))


def burst(queue: str) -> int:
    from django_delayq.mirror import Mirror

    return Mirror(queues=[queue], block=0.1).run(burst=True)


class Meter:
    """CPU and wall time of what runs in :meth:`measuring` (added up over its uses): this
    process's, the Redis server's, and the database server's."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cpu = self.wall = self.redis = 0.0
        self.database: float | None = 0.0

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        from bench.harness.cpu import redis_cpu_s

        redis, database = redis_cpu_s(self.client), database_cpu_s()
        cpu, wall = time.process_time(), time.perf_counter()
        yield
        self.cpu += time.process_time() - cpu
        self.wall += time.perf_counter() - wall
        self.redis += redis_cpu_s(self.client) - redis
        after = database_cpu_s()
        if self.database is not None and database is not None and after is not None:
            self.database += after - database
        else:
            self.database = None

    def figures(self, stages: Stages) -> dict[str, Any]:
        """Per job, per stream entry and per job event, once every row is checked."""
        from django_delayq.models import Job

        jobs, entries = stages.jobs, stages.entries()
        events = job_events(self.client, stages.keys.events)
        rows = Job.objects.filter(queue=stages.queue, status="completed").count()
        if rows != jobs:
            raise SystemExit(f"{stages.queue}: {rows:,} completed rows, expected {jobs:,}")
        return {
            "jobs": jobs, "entries": entries, "events": events,
            "cpu_s": round(self.cpu, 3), "wall_s": round(self.wall, 3),
            "cpu_us_per_job": round(self.cpu / jobs * 1e6, 1),
            "cpu_us_per_entry": round(self.cpu / entries * 1e6, 1),
            "cpu_us_per_event": round(self.cpu / events * 1e6, 1),
            "jobs_per_s": round(jobs / self.wall) if self.wall > 0 else None,
            "redis_cpu_us_per_job": round(self.redis / jobs * 1e6, 1),
            "database_cpu_us_per_job": (None if self.database is None
                                        else round(self.database / jobs * 1e6, 1)),
            "load": record.load(),
        }


def job_events(client: Any, stream: str) -> int:
    """The job events of a stream: an entry naming several jobs counts one per job."""
    total, start = 0, "-"
    while True:
        got = client.xrange(stream, start, "+", count=10_000)
        for _, fields in got:
            total += len(fields["jobs"].split(" ")) if "jobs" in fields else 1
        if len(got) < 10_000:
            return total
        start = "(" + got[-1][0]


def database_cpu_s() -> float | None:
    """CPU seconds of the PostgreSQL process serving this connection (None on SQLite,
    whose work is done in this process)."""
    from django.db import connection

    from bench.harness.processes import proc_stat

    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    stat = proc_stat(pid)
    return None if stat is None else stat.cpu_s


if __name__ == "__main__":
    main()
