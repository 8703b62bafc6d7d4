"""The job-history lake (:mod:`django_delayq.lake`) read by Spark.

:func:`lake_events` is the lake as written, one row per job event. :func:`attempts_from_lake`
folds the events into one row per job attempt (enqueued, run_at, started, finished,
outcome, worker, lateness, duration). :func:`jobs_from_lake` folds them further into one
row per job with the columns of the mirrored table (:data:`.history.HISTORY_SCHEMA`), so
that :func:`~.report.build_report` computes the same report from the lake as from the
table. Everything runs on the executors; the driver only plans.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pyarrow import fs as pafs
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ..engine.status import FINISHED_IN_HISTORY
from ..lake.schema import PARTITION
from ..lake.store import open_lake
from .history import FIELDS, FORMATS, filter_since, seconds_between

PARTITION_PREFIX = f"{PARTITION}="

#: Events that end an attempt, and what the attempt's outcome is then.
ENDS = ("completed", "failed", "retried", "reclaimed", "released")
#: The job status each event leaves. None: the status the entry names (``status``: an
#: enqueue of jobs that wait, a release of one whose last parent ended), else scheduled
#: or ready by run_at (an enqueue, a retry, a reschedule).
STATUS_AFTER = {
    "enqueued": None, "claimed": "claimed", "started": "active", "completed": "completed",
    "failed": "failed", "cancelled": "cancelled", "retried": None, "rescheduled": None,
    "promoted": "ready", "reclaimed": "ready", "released": "ready", "purged": "purged",
    "orphaned": "purged", "unblocked": None,
}


def lake_uri(where: str | Path) -> str:
    """A local path as a ``file://`` URI (what Spark reads whatever its default
    filesystem); a URL as given (``s3a://...`` for Spark's S3 connector)."""
    text = str(where)
    if "://" in text:
        return text
    path = Path(text).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"no lake at {text}: not a directory")
    return path.as_uri()


def is_lake(where: str | Path) -> bool:
    """Whether ``where`` is a lake: a directory (or a URL of one) with ``date=``
    partitions, not a file export.

    A URL whose name ends like a file (``s3a://b/jobs.parquet``, ``.csv``, ``.jsonl``)
    is a file. Another URL is looked at through ``pyarrow.fs`` when PyArrow opens it (a
    directory with ``date=`` partitions is a lake, anything else a file export); one it
    cannot open (Spark's own ``s3a://``, no credentials here) is taken as a lake.
    """
    text = str(where)
    if "://" not in text:
        path = Path(text)
        return path.is_dir() and any(p.name.startswith(PARTITION_PREFIX)
                                     for p in path.iterdir())
    name = text.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    if Path(name).suffix.lower() in FORMATS:
        return False
    try:
        filesystem, root = open_lake(text)
        if filesystem.get_file_info(root).type != pafs.FileType.Directory:
            return False
        return any(info.base_name.startswith(PARTITION_PREFIX) for info in
                   filesystem.get_file_info(pafs.FileSelector(root)))
    except (ValueError, OSError):
        return True


def lake_events(spark: SparkSession, where: str | Path) -> DataFrame:
    """The lake's rows (columns of :data:`django_delayq.lake.schema.ARROW_SCHEMA` and the
    ``date`` partition)."""
    uri = lake_uri(where)
    return spark.read.option("basePath", uri).parquet(uri)


def _order() -> Column:
    return F.struct("stream_ms", "stream_seq")


def _with_run_at(events: DataFrame) -> DataFrame:
    """Each event with ``due``: the job's run_at as of that event (the newest one set by
    an enqueue, retry or reschedule before it)."""
    job = Window.partitionBy("queue", "job_id").orderBy("stream_ms", "stream_seq")
    so_far = job.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    return events.withColumn("due", F.last("run_at", ignorenulls=True).over(so_far))


def _job_facts(events: DataFrame) -> DataFrame:
    """Per job: what its enqueue said (task, priority, limit, time)."""
    enq = F.col("event") == "enqueued"
    return events.groupBy("queue", "job_id").agg(
        F.max("task_name").alias("task_name"),
        F.max("priority").alias("priority"),
        F.max("max_attempts").alias("max_attempts"),
        F.min(F.when(enq, F.col("ts"))).alias("enqueued_at"),
    )


def _attempts(events: DataFrame) -> DataFrame:
    ends = F.col("event").isin(*ENDS)
    begins = F.col("event").isin("claimed", "started")
    return (events.where(F.col("attempt").isNotNull())
            .groupBy("queue", "job_id", "attempt").agg(
                F.min_by("due", F.when(begins, _order())).alias("run_at"),
                F.coalesce(F.max(F.when(ends, F.col("started_at"))),
                           F.min(F.when(F.col("event") == "started", F.col("ts"))))
                .alias("started_at"),
                F.max(F.when(ends, F.col("ts"))).alias("finished_at"),
                F.max_by("event", F.when(ends, _order())).alias("outcome"),
                F.coalesce(F.max(F.when(begins, F.col("worker"))), F.max("worker"))
                .alias("worker"),
                F.max_by("error", F.when(F.col("error").isNotNull(), _order()))
                .alias("error"),
                F.max(_order()).alias("last"),
            ))


def attempts_from_lake(spark: SparkSession, where: str | Path) -> DataFrame:
    """One row per job attempt: job_id, queue, task_name, attempt, enqueued_at, run_at,
    started_at, finished_at, outcome (completed, failed, retried, reclaimed, released;
    null while running), worker, error, lateness and duration (seconds)."""
    events = _with_run_at(lake_events(spark, where))
    attempts = _attempts(events).join(_job_facts(events), ["queue", "job_id"], "left")
    return attempts.select(
        "job_id", "queue", "task_name", "attempt", "enqueued_at", "run_at", "started_at",
        "finished_at", "outcome", "worker", "error",
        F.when(F.col("started_at").isNotNull(),
               seconds_between("started_at", "run_at")).alias("lateness"),
        F.when(F.col("outcome").isNotNull() & F.col("started_at").isNotNull(),
               seconds_between("finished_at", "started_at")).alias("duration"),
    )


def _status(event: Column, due: Column, ts: Column, named: Column) -> Column:
    by_run_at = F.when(due > ts, F.lit("scheduled")).otherwise(F.lit("ready"))
    out = F.when(named.isNotNull(), named)
    for name, status in STATUS_AFTER.items():
        out = out.when(event == name, by_run_at if status is None else F.lit(status))
    return out


def jobs_from_lake(spark: SparkSession, where: str | Path, *,
                   since: dt.timedelta | None = None) -> DataFrame:
    """One row per job with the mirrored table's columns: its status after its newest
    event, its newest run_at, and the start, finish, worker of its last attempt."""
    events = _with_run_at(lake_events(spark, where))
    known = events.where(F.col("event").isin(*STATUS_AFTER))
    last = (known.groupBy("queue", "job_id")
            .agg(F.max_by(F.struct("event", "due", "ts", "status"), _order()).alias("newest"),
                 F.max("attempt").alias("attempts"),
                 F.max_by("error", F.when(F.col("error").isNotNull(), _order()))
                 .alias("error")))
    attempts = _attempts(events)
    newest = Window.partitionBy("queue", "job_id").orderBy(F.col("attempt").desc())
    last_attempt = (attempts.withColumn("rank", F.row_number().over(newest))
                    .where("rank = 1").select("queue", "job_id", "started_at", "worker",
                                              F.col("finished_at").alias("attempt_end")))
    status = _status(F.col("newest.event"), F.col("newest.due"), F.col("newest.ts"),
                     F.col("newest.status"))
    jobs = (last.join(_job_facts(events), ["queue", "job_id"], "left")
            .join(last_attempt, ["queue", "job_id"], "left")
            .withColumn("status", status))
    finished = F.when(F.col("status").isin(*FINISHED_IN_HISTORY), F.col("newest.ts"))
    df = jobs.select(
        "job_id", "queue", "task_name", "status", "priority",
        F.col("newest.due").alias("run_at"), "enqueued_at", "started_at",
        finished.alias("finished_at"), F.coalesce("attempts", F.lit(0)).alias("attempts"),
        "max_attempts", "worker", "error",
        F.lit(None).alias("damaged"),  # the lake holds events, not job records
    )
    return filter_since(df.select(*[F.col(n).cast(t).alias(n) for n, t, _ in FIELDS]), since)
