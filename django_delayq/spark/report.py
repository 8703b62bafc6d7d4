"""The job-history report: per queue and task, counts, success rate, lateness, duration
and throughput, plus a timeline and the worst offenders.

Percentiles are exact: Spark SQL's ``percentile``, which sorts the n values of a group
and, for fraction p, takes position ``p * (n - 1)`` (0-based), interpolating linearly
between the two neighbouring values (the ``linear`` method of numpy's ``percentile``).
Lateness is ``started_at - run_at`` of jobs that started (last attempt), duration is
``finished_at - started_at`` of jobs that finished (completed or failed), in seconds.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..engine.status import HISTORY_STATUSES
from .history import seconds_between

#: A count per status in each summary row, in lifecycle order (waiting to purged).
STATUSES = HISTORY_STATUSES
PERCENTILES = (0.5, 0.95, 0.99)
ALL_TASKS = "*"
#: The most timeline buckets a report draws; longer windows get wider buckets.
MAX_BUCKETS = 360


@dataclass(slots=True)
class Report:
    """A computed report: plain rows (dicts), small enough to print, plot and write."""

    #: One row per (queue, task) and one per queue with ``task_name == "*"``.
    summary: list[dict[str, Any]] = field(default_factory=list)
    #: One row per (queue, bucket start): finished jobs per minute, lateness p50/p95.
    timeline: list[dict[str, Any]] = field(default_factory=list)
    #: The jobs that started latest after their run_at, and those that ran longest.
    latest: list[dict[str, Any]] = field(default_factory=list)
    longest: list[dict[str, Any]] = field(default_factory=list)
    bucket_seconds: int = 60
    window_minutes: float = 1.0
    jobs: int = 0
    generated_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))

    def row(self, queue: str, task_name: str = ALL_TASKS) -> dict[str, Any]:
        """The summary row of ``queue`` and ``task_name`` (``"*"``: the whole queue)."""
        for r in self.summary:
            if r["queue"] == queue and r["task_name"] == task_name:
                return r
        raise KeyError(f"no report row for queue={queue!r} task={task_name!r}")


def _aware(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with timestamps as aware UTC datetimes.

    PySpark hands TIMESTAMP values to Python as naive datetimes in the local time of
    the Python process (whatever the session time zone); ``astimezone`` reads them so.
    """
    return {k: v.astimezone(dt.UTC) if isinstance(v, dt.datetime) and v.tzinfo is None else v
            for k, v in row.items()}


def prepare(df: DataFrame) -> DataFrame:
    """``df`` with ``lateness``, ``duration`` (seconds) and ``finished`` (bool) columns."""
    finished = F.col("status").isin("completed", "failed") & F.col("finished_at").isNotNull()
    return (
        df.withColumn("lateness", F.when(F.col("started_at").isNotNull(),
                                         seconds_between("started_at", "run_at")))
        .withColumn("duration", F.when(finished, seconds_between("finished_at", "started_at")))
        .withColumn("finished", finished)
    )


def _percentiles(column: str) -> Column:
    fractions = ", ".join(str(p) for p in PERCENTILES)
    return F.expr(f"percentile({column}, array({fractions}))").alias(f"{column}_pct")


def _aggregates() -> list[Column]:
    return [
        F.count(F.lit(1)).alias("total"),
        *[F.sum(F.when(F.col("status") == s, 1).otherwise(0)).alias(s) for s in STATUSES],
        F.count("damaged").alias("damaged"),
        _percentiles("lateness"),
        _percentiles("duration"),
        F.max("lateness").alias("lateness_max"),
        F.max("duration").alias("duration_max"),
    ]


def _unpack(row: dict[str, Any], window_minutes: float) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if not k.endswith("_pct")}
    for name in ("lateness", "duration"):
        values = row[f"{name}_pct"] or [None] * len(PERCENTILES)
        for p, v in zip(PERCENTILES, values, strict=True):
            out[f"{name}_p{round(p * 100)}"] = v
    done = out["completed"] + out["failed"]
    out["success_rate"] = out["completed"] / done if done else None
    out["throughput_per_min"] = done / window_minutes
    return out


def build_report(df: DataFrame, *, since: dt.timedelta | None = None,
                 top: int = 10) -> Report:
    """Compute the report of the jobs in ``df`` (columns of ``history.HISTORY_SCHEMA``).

    Throughput per minute is finished jobs divided by the window: ``since`` when given,
    else the minutes from the first to the last finish in ``df`` (at least one).
    ``peak_per_min`` is the most jobs of the group that finished within one minute.
    """
    jobs = prepare(df).cache()
    try:
        return _build(jobs, since, top)
    finally:
        jobs.unpersist()


def _build(jobs: DataFrame, since: dt.timedelta | None, top: int) -> Report:
    # Four Spark jobs in all: the summary (one rollup), peaks, timeline, offenders.
    report = Report()
    grouped = jobs.rollup("queue", "task_name").agg(
        *_aggregates(),
        F.min(F.when(F.col("finished"), F.col("finished_at"))).alias("first_finish"),
        F.max(F.when(F.col("finished"), F.col("finished_at"))).alias("last_finish"),
        F.grouping_id().alias("level"),
    ).collect()
    overall = next((_aware(r.asDict()) for r in grouped if r["level"] == 3), None)
    report.jobs = overall["total"] if overall else 0
    if since is not None:
        report.window_minutes = max(since.total_seconds() / 60, 1.0)
    elif overall is not None and overall["first_finish"] is not None:
        seconds = (overall["last_finish"] - overall["first_finish"]).total_seconds()
        report.window_minutes = max(seconds / 60, 1.0)

    peaks = _peaks(jobs)
    key_order = ["queue", "task_name", "total", *STATUSES, "damaged", "success_rate",
                 "lateness_p50", "lateness_p95", "lateness_p99", "lateness_max",
                 "duration_p50", "duration_p95", "duration_p99", "duration_max",
                 "throughput_per_min", "peak_per_min"]
    rows = []
    for r in grouped:
        if r["level"] == 3:
            continue
        out = _unpack(r.asDict(), report.window_minutes)
        if r["level"] == 1:
            out["task_name"] = ALL_TASKS
        out["peak_per_min"] = peaks.get((out["queue"], out["task_name"]), 0)
        rows.append({k: out[k] for k in key_order})
    report.summary = sorted(rows, key=lambda x: (x["queue"], x["task_name"] != ALL_TASKS,
                                                 x["task_name"]))

    report.bucket_seconds = _bucket_seconds(report.window_minutes)
    report.timeline = _timeline(jobs, report.bucket_seconds)
    report.latest, report.longest = _offenders(jobs, top)
    return report


def _peaks(jobs: DataFrame) -> dict[tuple[str, str], int]:
    """The most jobs finished within one minute, per (queue, task) and (queue, "*")."""
    per_task = (jobs.where("finished")
                .groupBy("queue", "task_name", F.date_trunc("minute", "finished_at")
                         .alias("minute"))
                .agg(F.count(F.lit(1)).alias("n")))
    per_queue = (per_task.groupBy("queue", "minute").agg(F.sum("n").alias("n"))
                 .select("queue", F.lit(ALL_TASKS).alias("task_name"), "minute", "n"))
    both = per_task.unionByName(per_queue).groupBy("queue", "task_name").agg(
        F.max("n").alias("peak"))
    return {(r["queue"], r["task_name"]): int(r["peak"]) for r in both.collect()}


def _offenders(jobs: DataFrame, top: int) -> tuple[list[dict[str, Any]],
                                                   list[dict[str, Any]]]:
    """The ``top`` latest starts and the ``top`` longest runs (ties by job id)."""
    if top <= 0:
        return [], []
    columns = ["job_id", "queue", "task_name", "status", "attempts", "run_at", "started_at",
               "finished_at"]

    def worst(metric: str) -> DataFrame:
        return (jobs.where(F.col(metric).isNotNull())
                .orderBy(F.col(metric).desc(), "job_id").limit(top)
                .select(F.lit(metric).alias("metric"), *columns,
                        F.col(metric).alias("seconds")))

    latest: list[dict[str, Any]] = []
    longest: list[dict[str, Any]] = []
    for r in worst("lateness").unionByName(worst("duration")).collect():
        row = _aware(r.asDict())
        metric = row.pop("metric")
        row[metric] = row.pop("seconds")
        (latest if metric == "lateness" else longest).append(row)
    latest.sort(key=lambda x: (-x["lateness"], x["job_id"]))
    longest.sort(key=lambda x: (-x["duration"], x["job_id"]))
    return latest, longest


def _bucket_seconds(window_minutes: float) -> int:
    minutes = max(1, math.ceil(window_minutes / MAX_BUCKETS))
    return 60 * minutes


def _bucket(column: str, seconds: int) -> Column:
    epoch = F.unix_seconds(F.col(column))
    return F.timestamp_seconds(epoch - F.pmod(epoch, F.lit(seconds)))


def _timeline(jobs: DataFrame, seconds: int) -> list[dict[str, Any]]:
    """Per queue and bucket: finished jobs per minute, and lateness p50/p95 of starts."""
    finished = (jobs.where("finished")
                .groupBy("queue", _bucket("finished_at", seconds).alias("bucket"))
                .agg(F.sum(F.when(F.col("status") == "completed", 1).otherwise(0))
                     .alias("completed"),
                     F.sum(F.when(F.col("status") == "failed", 1).otherwise(0)).alias("failed")))
    started = (jobs.where(F.col("lateness").isNotNull())
               .groupBy("queue", _bucket("started_at", seconds).alias("bucket"))
               .agg(F.expr("percentile(lateness, array(0.5, 0.95))").alias("late")))
    rows = []
    per_minute = seconds / 60
    for r in finished.join(started, ["queue", "bucket"], "full_outer").collect():
        completed, failed = r["completed"] or 0, r["failed"] or 0
        late = r["late"] or [None, None]
        rows.append({"queue": r["queue"], "bucket": _aware({"b": r["bucket"]})["b"],
                     "completed": completed,
                     "failed": failed, "per_min": (completed + failed) / per_minute,
                     "lateness_p50": late[0], "lateness_p95": late[1]})
    return _fill_gaps(rows, seconds)


def _fill_gaps(rows: list[dict[str, Any]], seconds: int) -> list[dict[str, Any]]:
    """Add empty buckets, so quiet minutes show as zero throughput rather than a gap."""
    if not rows:
        return rows
    step = dt.timedelta(seconds=seconds)
    first, last = min(r["bucket"] for r in rows), max(r["bucket"] for r in rows)
    have = {(r["queue"], r["bucket"]) for r in rows}
    for queue in {r["queue"] for r in rows}:
        bucket = first
        while bucket <= last:
            if (queue, bucket) not in have:
                rows.append({"queue": queue, "bucket": bucket, "completed": 0, "failed": 0,
                             "per_min": 0.0, "lateness_p50": None, "lateness_p95": None})
            bucket += step
    rows.sort(key=lambda x: (x["queue"], x["bucket"]))
    return rows
