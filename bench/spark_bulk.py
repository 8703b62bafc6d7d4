"""Bulk scheduling: N jobs from a Spark DataFrame next to ``enqueue_many`` in one process.

    python -m bench.spark_bulk [--scale 1] [--jobs 1000000] [--master local[*]]

Starts a throwaway Redis (``django_delayq.testing.RedisServer``), enqueues N delayed
jobs (one positional argument, a run_at in the future, a job id each) three ways,
flushing Redis in between:

- ``enqueue_many``: one Python process, ``Broker.enqueue_many`` with explicit job ids;
- ``spark``: ``enqueue_dataframe`` over ``spark.range(N)``, job ids derived from the
  rows, executors enqueuing in parallel;
- ``spark_rerun``: the same DataFrame again, every job found and counted a duplicate.

Prints one JSON line and writes ``spark_bulk.json`` (in ``--out``). Spark's start-up is
reported apart and not counted in the rates. Needs no Django settings.
"""

from __future__ import annotations

import datetime as dt
import json
import time

import redis

from bench import record
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest, Queue
from django_delayq.testing import RedisServer

JOBS = 1_000_000
TASK = "bench.tasks.noop"
RUN_AT = dt.datetime(2031, 1, 1, tzinfo=dt.UTC)


def bench_enqueue_many(url: str, jobs: int, chunk_size: int) -> dict[str, float]:
    client = redis.Redis.from_url(url, decode_responses=True)
    broker = Broker(client, EngineConfig())
    requests = (EnqueueRequest(task=TASK, args=[i], run_at=RUN_AT + dt.timedelta(seconds=i % 3600),
                               job_id=f"bench-{i}") for i in range(jobs))
    started = time.perf_counter()
    result = broker.enqueue_many("bench", requests, chunk_size=chunk_size)
    seconds = time.perf_counter() - started
    assert result.enqueued == jobs, result.enqueued
    assert Queue("bench", broker=broker).counts()["scheduled"] == jobs
    client.flushdb()
    client.close()
    return {"seconds": round(seconds, 2), "jobs_per_s": round(jobs / seconds)}


def bench_spark(url: str, jobs: int, chunk_size: int, master: str,
                partitions: int | None, extra: dict[str, str] | None = None
                ) -> dict[str, object]:
    from pyspark.sql import functions as F

    from django_delayq.spark import enqueue_dataframe, spark_session

    started = time.perf_counter()
    spark = spark_session(master, app_name="delayq-bench", config={
        "spark.ui.enabled": "false", "spark.driver.memory": "2g", **(extra or {})})
    startup = time.perf_counter() - started
    df = spark.range(0, jobs, numPartitions=partitions or spark.sparkContext.defaultParallelism)
    df = df.select(F.col("id").alias("n"), F.timestamp_seconds(
        F.lit(int(RUN_AT.timestamp())) + F.col("id") % 3600).alias("when"))
    out: dict[str, object] = {"startup_seconds": round(startup, 2),
                              "partitions": df.rdd.getNumPartitions()}
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        for name, expect in (("spark", (jobs, 0)), ("spark_rerun", (0, jobs))):
            t0 = time.perf_counter()
            summary = enqueue_dataframe(df, TASK, args=["n"], run_at="when", queue="bench",
                                        redis_url=url, chunk_size=chunk_size)
            seconds = time.perf_counter() - t0
            assert (summary.enqueued, summary.duplicates) == expect, summary
            assert summary.rejected == 0, summary.rejected_rows[:3]
            out[name] = {"seconds": round(seconds, 2), "jobs_per_s": round(jobs / seconds)}
        broker = Broker(client, EngineConfig())
        assert Queue("bench", broker=broker).counts()["scheduled"] == jobs
    finally:
        client.flushdb()
        client.close()
        spark.stop()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"jobs (default {JOBS:,} x scale)")
    parser.add_argument("--chunk-size", type=int, default=1_000)
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--partitions", type=int, default=None,
                        help="DataFrame partitions (default: Spark's default parallelism)")
    options = parser.parse_args(argv)
    jobs = options.jobs or record.scaled(JOBS, options.scale, 1_000)
    this_run = record.Run("spark_bulk", options.scale)
    with RedisServer() as server:
        baseline = bench_enqueue_many(server.url, jobs, options.chunk_size)
        spark = bench_spark(server.url, jobs, options.chunk_size, options.master,
                            options.partitions)
    path = this_run.write(options.out, {"jobs": jobs, "chunk_size": options.chunk_size,
                                        "master": options.master, "enqueue_many": baseline,
                                        **spark})
    print(json.dumps(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
