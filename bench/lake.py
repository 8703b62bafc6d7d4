"""The job-history lake and Spark past one machine: export rate, readers, a real cluster.

    python -m bench.lake [--scale 1] [--jobs 1000000] [--only export,cluster,jdbc]

- ``export``: N jobs' events (4 per job: enqueued, claimed, started, completed; the
  enqueues real, the rest appended in the engine's bulk format, tests/lake_events.py)
  exported to a local lake: an exporter killed halfway between a file and its
  acknowledgement, then a second one to the end; events per second over both. Then read
  back by Spark (``local[*]``): the event and attempt counts checked exact, the lateness
  p50/p99 against numpy's, and the read timed.
- ``jdbc``: the mirrored job table with N rows on a throwaway PostgreSQL, read by the
  ORM loader (on the driver) and by the JDBC loader (id slices on the executors), each
  counted and reported on.
- ``cluster``: ``enqueue_dataframe`` of N jobs on a standalone Spark cluster (a master and
  two workers of one core each, tests/spark_cluster.py) and on ``local[*]``.

Starts its own Redis (and PostgreSQL for ``jdbc``). Prints one JSON line, writes
``lake.json`` (in ``--out``) with the load average before and after each figure (the
machine may be shared).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from bench import record
from django_delayq.engine import Broker, EngineConfig
from django_delayq.engine.keys import QueueKeys
from django_delayq.testing import RedisServer

JOBS = 1_000_000
TASK = "bench.tasks.noop"


def load() -> float:
    return record.load()[0]


def bench_export(url: str, jobs: int) -> dict[str, Any]:
    from django_delayq.lake import Exporter
    from tests.lake_events import Crash, CrashBeforeAck, generate

    client = redis.Redis.from_url(url, decode_responses=True)
    broker = Broker(client, EngineConfig())
    keys = QueueKeys("dq", "bench")
    started = time.perf_counter()
    made = generate(broker, TASK, keys, jobs, t0=dt.datetime(2026, 1, 5, tzinfo=dt.UTC))
    generated = time.perf_counter() - started
    lake = Path(tempfile.mkdtemp(prefix="delayq-lake-bench-"))
    try:
        before = load()
        t0, cpu0 = time.perf_counter(), time.process_time()
        # Killed halfway, between a file and its acknowledgement, then run again: the
        # second run finds the pending batch's file and writes it no second time.
        # Both runs by one name: the second takes the batch back at once.
        crashing = CrashBeforeAck(str(lake), broker=broker, queues=["bench"], name="bench",
                                  batch_size=500, after=max(1, made.jobs // 250_000))
        with contextlib.suppress(Crash):
            crashing.run(burst=True)
        exporter = Exporter(str(lake), broker=broker, queues=["bench"], batch_size=500,
                            name="bench")
        exporter.run(burst=True)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        assert crashing.rows + exporter.rows == made.events, (crashing.rows, exporter.rows)
        out: dict[str, Any] = {
            "jobs": jobs, "events": made.events, "generate_seconds": round(generated, 1),
            "export_seconds": round(seconds, 1), "events_per_s": round(made.events / seconds),
            "exporter_cpu_us_per_event": round(cpu / made.events * 1e6, 2),
            "files": crashing.files + exporter.files,
            "crash_after_files": crashing.files,
            "lake_mib": round(sum(p.stat().st_size for p in lake.rglob("*.parquet")) / 2**20, 1),
            "load": [before, load()],
        }
        out["spark_read"] = bench_read(lake, made)
        return out
    finally:
        shutil.rmtree(lake, ignore_errors=True)
        client.flushdb()
        client.close()


def bench_read(lake: Path, made: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from django_delayq.spark import attempts_from_lake, spark_session
    from django_delayq.spark.lake import lake_events

    spark = spark_session("local[*]", app_name="delayq-lake-bench", config={
        "spark.ui.enabled": "false", "spark.driver.memory": "3g",
        "spark.sql.session.timeZone": "UTC"})
    try:
        before = load()
        t0 = time.perf_counter()
        events = lake_events(spark, str(lake)).count()
        counted = time.perf_counter() - t0
        t0 = time.perf_counter()
        row = attempts_from_lake(spark, str(lake)).agg(
            F.count(F.lit(1)).alias("n"),
            F.expr("percentile(lateness, array(0.5, 0.99))").alias("late")).first()
        attempts = time.perf_counter() - t0
        assert (events, row["n"]) == (made.events, made.jobs), (events, row["n"])
        import numpy as np

        want = np.percentile(np.array(made.lateness), [50, 99], method="linear")
        assert np.allclose(row["late"], want, rtol=1e-12, atol=1e-9), (row["late"], want)
        return {"events": events, "count_seconds": round(counted, 1),
                "attempts": row["n"], "attempts_with_percentiles_seconds": round(attempts, 1),
                "lateness_p50_p99": row["late"], "load": [before, load()]}
    finally:
        spark.stop()


def bench_cluster(url: str, jobs: int) -> dict[str, Any]:
    from bench.spark_bulk import bench_spark
    from tests.spark_cluster import SparkCluster, executor_pythonpath

    out: dict[str, Any] = {"jobs": jobs}
    before = load()
    out["local[*]"] = {**bench_spark(url, jobs, 1_000, "local[*]", None),
                       "load": [before, load()]}
    cluster = SparkCluster(workers=2, cores=1, memory="1200m").start()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["SPARK_EXECUTOR_PYTHONPATH"] = executor_pythonpath()
    try:
        before = load()
        out["standalone_2x1"] = {**bench_spark(url, jobs, 1_000, cluster.master_url, 2,
                                               extra={
            "spark.executorEnv.PYTHONPATH": executor_pythonpath(),
            "spark.pyspark.python": sys.executable,
            "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.memory": "768m", "spark.executor.cores": "1",
            "spark.cores.max": "2"}), "load": [before, load()]}
    finally:
        cluster.stop()
    return out


def bench_jdbc(rows: int, master: str) -> dict[str, Any]:
    """The job table of ``rows`` rows on a throwaway PostgreSQL, read by the ORM loader
    (the driver) and by the JDBC loader (the executors), each then reported on."""
    from tests.pg_server import PostgresServer

    server = PostgresServer().start()
    try:
        os.environ.update({"DELAYQ_TEST_PG_HOST": "127.0.0.1",
                           "DELAYQ_TEST_PG_PORT": str(server.port),
                           "DELAYQ_TEST_PG_USER": "postgres",
                           "DELAYQ_TEST_PG_NAME": "delayq_bench",
                           "DJANGO_SETTINGS_MODULE": "tests.settings_postgres"})
        import psycopg

        with psycopg.connect(f"host=127.0.0.1 port={server.port} user=postgres "
                             "dbname=postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE delayq_bench")
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        t0 = time.perf_counter()
        _fill_job_table(rows)
        filled = time.perf_counter() - t0
        return {"rows": rows, "fill_seconds": round(filled, 1), **_read_both(rows, master)}
    finally:
        server.stop()
        server.cleanup()


def _fill_job_table(rows: int) -> None:
    """``rows`` completed jobs, copied in SQL from one template row."""
    from django.db import connection

    from django_delayq.models import Job

    t0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)
    Job.objects.create(job_id="template", queue="bench", task_name="bench.work",
                       status="completed", run_at=t0, enqueued_at=t0, started_at=t0,
                       finished_at=t0, attempts=1, worker="w")
    varied = {
        "job_id": "'b-' || g",
        "task_name": "'bench.work.' || (g %% 3)",
        "run_at": "run_at + g * interval '1 millisecond'",
        "started_at": "run_at + g * interval '1 millisecond' + (g %% 997) * interval "
                      "'1 millisecond'",
        "finished_at": "run_at + g * interval '1 millisecond' + (g %% 997 + g %% 991) * "
                       "interval '1 millisecond'",
    }
    columns = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
    select = ", ".join(varied.get(c, c) for c in columns)
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({', '.join(columns)}) SELECT {select} "
                       f"FROM {table}, generate_series(1, %s) AS g WHERE job_id = 'template'",
                       [rows - 1])
        cursor.execute(f"ANALYZE {table}")


def _read_both(rows: int, master: str) -> dict[str, Any]:
    from django_delayq.spark import build_report, jdbc, jobs_from_jdbc, jobs_from_orm, spark_session

    spark = spark_session(master, app_name="delayq-jdbc-bench", config={
        "spark.ui.enabled": "false", "spark.driver.memory": "3g",
        "spark.sql.session.timeZone": "UTC", **jdbc.spark_config()})
    out: dict[str, Any] = {"master": master}
    try:
        for name, load_jobs in (("orm", lambda: jobs_from_orm(spark)),
                                ("jdbc", lambda: jobs_from_jdbc(spark))):
            before = load()
            t0 = time.perf_counter()
            df = load_jobs()
            counted = df.count()
            read = time.perf_counter() - t0
            t0 = time.perf_counter()
            report = build_report(df, top=5)
            reported = time.perf_counter() - t0
            assert (counted, report.jobs) == (rows, rows), (counted, report.jobs)
            out[name] = {"read_and_count_seconds": round(read, 1),
                         "rows_per_s": round(rows / read),
                         "report_seconds": round(reported, 1), "load": [before, load()]}
    finally:
        spark.stop()
    return out


#: The parts, in the order they run, and the key of each in lake.json.
PARTS = {"export": "export", "cluster": "cluster", "jdbc": "jdbc_vs_orm"}


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"jobs, and rows of the job table (default {JOBS:,} x scale)")
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--master", default="local[*]", help="Spark master of the "
                        "JDBC/ORM comparison")
    options = parser.parse_args(argv)
    jobs = options.jobs or record.scaled(JOBS, options.scale, 1_000)
    parts = [part for part in PARTS if part in options.only.split(",")]
    this_run = record.Run("lake", options.scale)
    result: dict[str, Any] = {"jobs": jobs}
    if len(parts) > 1:
        # Each part in a process of its own: py4j starts one JVM per Python process, and
        # that JVM keeps the classpath of its first session, so the JDBC driver jar of a
        # later session would not load (and a million rows' parts free their memory).
        for part in parts:
            with tempfile.TemporaryDirectory() as out:
                subprocess.run([sys.executable, "-m", "bench.lake", "--only", part, "--jobs",
                                str(jobs), "--master", options.master, "--out", out],
                               check=True)
                result[PARTS[part]] = json.loads((Path(out) / "lake.json").read_text())[
                    PARTS[part]]
    else:
        with RedisServer() as server:
            if "export" in parts:
                result["export"] = bench_export(server.url, jobs)
            if "cluster" in parts:
                result["cluster"] = bench_cluster(server.url, jobs)
        if "jdbc" in parts:
            result["jdbc_vs_orm"] = bench_jdbc(jobs, options.master)
    path = this_run.write(options.out, result)
    print(json.dumps(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
