"""The Spark pipeline: bulk scheduling from DataFrames and the job-history report.

One local SparkSession serves the whole module. Spark needs Java: without it these
tests fail with a message saying so.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from django_delayq import Job, Queue
from django_delayq.checks import check_settings
from tests.conftest import wait_until

pytestmark = pytest.mark.spark

UTC = dt.UTC
RECORD = "tests.testapp.tasks.record"
ADD = "tests.testapp.tasks.add"
FUTURE = dt.datetime(2031, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from django_delayq.spark import SparkSetupError, spark_session

    try:
        session = spark_session("local[2]", app_name="delayq-tests", config={
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.driver.memory": "1g",
        })
    except SparkSetupError as exc:
        pytest.fail(f"Spark cannot start, so the spark tests cannot run: {exc}")
    yield session
    session.stop()


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).astimezone(UTC)


# -- bulk scheduling ----------------------------------------------------------------


@pytest.mark.slow
def test_dataframe_of_100k_rows_enqueues_each_once(spark: Any) -> None:
    from pyspark.sql import functions as F

    from django_delayq.spark import enqueue_dataframe

    df = spark.range(100_000).select(
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("tag"),
        F.timestamp_seconds(F.lit(int(FUTURE.timestamp())) + F.col("id") % 3600).alias("when"),
    )
    first = enqueue_dataframe(df, RECORD, args=["tag"], run_at="when")
    assert (first.enqueued, first.duplicates, first.rejected) == (100_000, 0, 0)
    assert Queue("default").counts()["scheduled"] == 100_000

    # a re-run, split differently, finds every (derived) job id and adds nothing
    again = enqueue_dataframe(df.repartition(3), RECORD, args=["tag"], run_at="when")
    assert (again.enqueued, again.duplicates, again.rejected) == (0, 100_000, 0)
    assert Queue("default").counts()["scheduled"] == 100_000


def test_jobs_carry_arguments_run_at_priority_and_ids(spark: Any) -> None:
    from pyspark.sql import functions as F

    from django_delayq.spark import enqueue_dataframe

    df = spark.createDataFrame(
        [("a-1", 1, 2, 5), ("a-2", 10, 20, -3), ("a-2:c", 1, 1, 0)],
        "jid string, x int, y int, prio int"
    ).withColumn("when", F.to_timestamp(F.lit("2031-06-01T12:00:00+02:00")))
    summary = enqueue_dataframe(df, ADD, args=["x", "y"], run_at="when", priority="prio",
                                job_id="jid", queue="math")
    assert (summary.enqueued, summary.rejected) == (2, 1)
    assert "may not end in" in summary.rejected_rows[0].reason  # job a-2's dependants' key
    assert summary.queues == {"math": 2}
    job = Job.fetch("a-2", queue="math")
    assert job.task_name == ADD
    assert job.args == [10, 20]
    assert job.priority == -3
    assert job.run_at == dt.datetime(2031, 6, 1, 10, 0, tzinfo=UTC)
    assert job.status == "scheduled"


def test_timestamp_columns_are_instants_whatever_the_session_time_zone(spark: Any) -> None:
    from pyspark.sql import functions as F

    from django_delayq.spark import enqueue_dataframe

    spark.conf.set("spark.sql.session.timeZone", "America/New_York")
    try:
        df = spark.createDataFrame([("tz-1",)], "jid string").select(
            "jid",
            F.to_timestamp(F.lit("2031-01-01T09:00:00+02:00")).alias("when"),
            F.struct(F.lit(7).alias("n"),
                     F.to_timestamp(F.lit("2031-01-02T00:00:00Z")).alias("at")).alias("info"),
            F.array(F.lit("p"), F.lit("q")).alias("tags"),
        )
        summary = enqueue_dataframe(df, RECORD, args=["jid"],
                                    kwargs={"extra": "info"}, run_at="when", job_id="jid")
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")
    assert summary.enqueued == 1, summary.rejected_rows
    job = Job.fetch("tz-1", queue="default")
    assert job.run_at == dt.datetime(2031, 1, 1, 7, 0, tzinfo=UTC)
    assert job.kwargs == {"extra": {"n": 7, "at": "2031-01-02T00:00:00Z"}}


def test_rows_that_cannot_be_jobs_come_back_with_reasons(spark: Any) -> None:
    from pyspark.sql import types as T

    from django_delayq.spark import enqueue_dataframe

    schema = T.StructType([
        T.StructField("name", T.StringType()),
        T.StructField("task", T.StringType()),
        T.StructField("when", T.StringType()),
        T.StructField("blob", T.BinaryType()),
        T.StructField("codes", T.MapType(T.IntegerType(), T.StringType())),
    ])
    good = "2031-03-01T08:00:00+00:00"
    rows = [
        ("ok", RECORD, good, None, None),
        ("ok-z", RECORD, "2031-03-01T08:00:00Z", None, {}),
        ("null-run-at", RECORD, None, None, None),
        ("naive", RECORD, "2031-03-01T08:00:00", None, None),
        ("not-a-time", RECORD, "next tuesday", None, None),
        ("binary", RECORD, good, bytearray(b"\x00\xff"), None),
        ("int-keys", RECORD, good, None, {1: "one"}),
        ("unknown", "tests.testapp.tasks.nope", good, None, None),
    ]
    df = spark.createDataFrame(rows, schema).repartition(2)
    summary = enqueue_dataframe(df, task_column="task", args=["name"],
                                kwargs={"blob": "blob", "extra": "codes"}, run_at="when")
    reasons = {r.row["name"]: r.reason for r in summary.rejected_rows}
    assert (summary.enqueued, summary.duplicates, summary.rejected) == (2, 0, 6)
    assert set(reasons) == {"null-run-at", "naive", "not-a-time", "binary", "int-keys",
                            "unknown"}
    assert reasons["null-run-at"] == "run_at is null"
    assert "naive" in reasons["naive"]
    assert "not an ISO 8601" in reasons["not-a-time"]
    assert "binary" in reasons["binary"]
    assert "'blob'" in reasons["binary"]
    assert "int keys" in reasons["int-keys"]
    assert "'extra'" in reasons["int-keys"]
    assert "unknown task 'tests.testapp.tasks.nope'" in reasons["unknown"]
    assert summary.rows == len(rows)
    assert Queue("default").counts()["scheduled"] == 2

    frame = summary.rejected_dataframe(spark)
    assert frame.count() == 6
    naive = frame.where("reason like '%naive%'").first()
    assert json.loads(naive["row"])["when"] == "2031-03-01T08:00:00"


def test_mistakes_that_concern_every_row_raise_before_anything_is_sent(spark: Any) -> None:
    from pyspark.sql import functions as F

    from django_delayq import UnknownTask
    from django_delayq.spark import enqueue_dataframe

    df = spark.createDataFrame([(1, 2)], "x int, y int").withColumn(
        "local", F.to_timestamp_ntz(F.lit("2031-01-01 09:00:00")))
    with pytest.raises(UnknownTask, match=r"no task named 'tests\.testapp\.tasks\.nope'"):
        enqueue_dataframe(df, "tests.testapp.tasks.nope", args=["x"])
    with pytest.raises(TypeError, match="TIMESTAMP_NTZ"):
        enqueue_dataframe(df, ADD, args=["x", "y"], run_at="local")
    with pytest.raises(ValueError, match="column 'z' is not in the DataFrame"):
        enqueue_dataframe(df, ADD, args=["x", "z"])
    with pytest.raises(TypeError, match="add"):
        enqueue_dataframe(df, ADD, args=["x"])  # add(a, b) needs two arguments
    assert Queue("default").counts()["scheduled"] == 0
    assert Queue("default").counts()["ready"] == 0


def test_known_tasks_list_and_explicit_redis_url(spark: Any) -> None:
    from django_delayq.spark import enqueue_dataframe

    df = spark.createDataFrame([("x", "other.task"), ("y", "not.listed")], "v string, t string")
    url = os.environ["DELAYQ_TEST_REDIS_URL"]
    summary = enqueue_dataframe(df, task_column="t", args=["v"], known_tasks=["other.task"],
                                redis_url=url, queue="elsewhere", delay=3600)
    assert (summary.enqueued, summary.rejected) == (1, 1)
    assert summary.rejected_rows[0].reason.startswith("unknown task 'not.listed'")
    assert Queue("elsewhere").counts()["scheduled"] == 1


def test_a_job_from_spark_stores_the_bytes_of_the_same_job_from_django(spark: Any) -> None:
    """The one codec: a row's values are stored as Django's producers store them."""
    import decimal

    from pyspark.sql import types as T

    from django_delayq.spark import enqueue_dataframe
    from tests.test_codec import django_json, stored_arguments
    from tests.testapp.tasks import take_anything

    args = [dt.date(2031, 1, 2), decimal.Decimal("12.50"), "naïve ☃ 😀",
            [1.5, None, -2.0], {"ü": "日本", "n": 7}, {"k": 1}]
    kwargs = {"at": dt.datetime(2031, 1, 2, 3, 4, 5, 678_901, tzinfo=UTC),
              "span": dt.timedelta(days=-1, seconds=3, microseconds=5)}
    schema = T.StructType([
        T.StructField("jid", T.StringType()),
        T.StructField("day", T.DateType()),
        T.StructField("amount", T.DecimalType(10, 2)),
        T.StructField("text", T.StringType()),
        T.StructField("nums", T.ArrayType(T.DoubleType())),
        T.StructField("info", T.StructType([T.StructField("ü", T.StringType()),
                                            T.StructField("n", T.IntegerType())])),
        T.StructField("counts", T.MapType(T.StringType(), T.IntegerType())),
        T.StructField("at", T.TimestampType()),
        T.StructField("span", T.DayTimeIntervalType()),
    ])
    df = spark.createDataFrame([("from-spark", *args, *kwargs.values())], schema)
    summary = enqueue_dataframe(df, take_anything.name,
                                args=["day", "amount", "text", "nums", "info", "counts"],
                                kwargs=["at", "span"], job_id="jid")
    assert summary.enqueued == 1, summary.rejected_rows
    direct = take_anything.enqueue(*args, **kwargs)
    expected = (django_json(args), django_json(kwargs))
    assert '"span":"-P0DT23H59M56.999995S"' in expected[1]
    assert stored_arguments("default", "from-spark") == expected
    assert stored_arguments("default", direct.id) == expected


def test_executors_enqueue_with_the_drivers_engine_config(spark: Any, settings: Any) -> None:
    """MIN_REPLICAS reaches the executors: with no replica, their enqueue says so."""
    from django_delayq.spark import enqueue_dataframe

    settings.DELAYQ = {**settings.DELAYQ, "MIN_REPLICAS": 1, "MIN_REPLICAS_TIMEOUT": 0.05}
    df = spark.createDataFrame([("r-1", 1)], "jid string, n int")
    with pytest.raises(Exception, match="NotReplicated"):
        enqueue_dataframe(df, ADD, args=["n", "n"], job_id="jid")


def test_sharded_queues_get_each_job_in_its_shard(spark: Any, settings: Any) -> None:
    from django_delayq.connection import get_broker
    from django_delayq.spark import enqueue_dataframe

    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"wide": {"shards": 4}}}
    df = spark.range(200).selectExpr("id AS n", "concat('w-', id) AS jid")
    summary = enqueue_dataframe(df, ADD, args=["n", "n"], job_id="jid", queue="wide",
                                delay=600)
    assert summary.enqueued == 200
    assert Queue("wide").counts()["scheduled"] == 200
    broker = get_broker()
    shards = {broker.keys_for("wide", f"w-{i}").tag for i in range(200)}
    assert len(shards) == 4
    assert all(broker.client.exists(broker.keys_for("wide", f"w-{i}").job(f"w-{i}"))
               for i in range(0, 200, 7))


@pytest.mark.slow
def test_enqueue_on_a_redis_cluster(spark: Any, settings: Any) -> None:
    from django_delayq.spark import enqueue_dataframe
    from tests.servers import RedisCluster

    try:
        cluster = RedisCluster().start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"could not start a local Redis Cluster (redis-server and redis-cli "
                    f"are needed): {exc}")
    try:
        settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": cluster.url,
                           "QUEUES": {"wide": {"shards": 3}}}
        df = spark.range(300).selectExpr("id AS n")
        first = enqueue_dataframe(df, ADD, args=["n", "n"], queue="wide", delay=600)
        again = enqueue_dataframe(df, ADD, args=["n", "n"], queue="wide", delay=600)
        assert (first.enqueued, again.enqueued, again.duplicates) == (300, 0, 300)
        assert Queue("wide").counts()["scheduled"] == 300
    finally:
        cluster.cleanup()


@pytest.mark.slow
def test_enqueue_through_a_sentinel_url(spark: Any, settings: Any) -> None:
    """The executors reach the primary through the sentinels, with MIN_REPLICAS: every
    job is on the replica when the call returns."""
    import redis

    from django_delayq.spark import enqueue_dataframe
    from tests.servers import RedisSentinelGroup

    try:
        group = RedisSentinelGroup().start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"could not start a primary, a replica and three sentinels: {exc}")
    try:
        settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": group.url(db=3), "MIN_REPLICAS": 1}
        df = spark.range(300).selectExpr("id AS n", "concat('s-', id) AS jid")
        first = enqueue_dataframe(df, ADD, args=["n", "n"], job_id="jid", delay=600)
        again = enqueue_dataframe(df, ADD, args=["n", "n"], job_id="jid", delay=600)
        assert (first.enqueued, again.enqueued, again.duplicates) == (300, 0, 300)
        replica = redis.Redis(port=group.replicas[0].port, db=3)
        assert replica.zcard("{dq:default}:scheduled") == 300
    finally:
        group.cleanup()


def test_executors_do_not_import_django(spark: Any) -> None:
    from django_delayq.spark.partition import EnqueuePlan, enqueue_partition

    plan = EnqueuePlan(redis_url=os.environ["DELAYQ_TEST_REDIS_URL"], task=RECORD,
                       args=((0, ("plain",), "tag"),), columns=("tag",), delay=60.0)

    def probe(rows: Iterator[Any]) -> Iterator[tuple[bool, int]]:
        import sys as executor_sys

        result = next(enqueue_partition(plan, rows))
        yield "django" in executor_sys.modules, result.enqueued

    out = spark.sparkContext.parallelize([("a",), ("b",)], 2).mapPartitions(probe).collect()
    assert out == [(False, 1), (False, 1)]
    assert Queue("default").counts()["scheduled"] == 2


def test_enqueue_command_reads_a_file_and_is_safe_to_rerun(spark: Any, tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("a,b,when\n1,2,2031-01-01T00:00:00+00:00\n3,4,2031-01-01T00:01:00Z\n"
                    "5,6,2031-01-01 00:02:00\n")
    out = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        call_command("delayq_spark_enqueue", input=str(path), task=ADD,
                     run_at_column="when", args_columns="a,b", queue="math", stdout=out)
    assert exit_info.value.code == 2  # some rows were rejected
    text = out.getvalue()
    assert "enqueued=2 duplicates=0 rejected=1 rows=3" in text
    assert "naive" in text
    assert "partitions" in text
    assert sorted(j.args for j in Queue("math").jobs("scheduled")) == [[1, 2], [3, 4]]

    jsonl = tmp_path / "jobs.jsonl"
    jsonl.write_text("\n".join(json.dumps({"a": a, "b": b, "when": w}) for a, b, w in [
        (1, 2, "2031-01-01T00:00:00+00:00"), (3, 4, "2031-01-01T00:01:00Z")]) + "\n")
    out = io.StringIO()
    call_command("delayq_spark_enqueue", input=str(jsonl), task=ADD, run_at_column="when",
                 args_columns="a,b", queue="math", stdout=out)
    assert "enqueued=0 duplicates=2 rejected=0" in out.getvalue()

    with pytest.raises(CommandError, match="no such file"):
        call_command("delayq_spark_enqueue", input=str(tmp_path / "missing.csv"), task=ADD)


def test_progress_reports_running_partitions(spark: Any, redis_client: Any) -> None:
    from django_delayq.spark.progress import Progress

    url = os.environ["DELAYQ_TEST_REDIS_URL"]

    def gated(rows: Iterator[Any]) -> Iterator[int]:
        import redis as executor_redis

        client = executor_redis.Redis.from_url(url)
        client.blpop(["test:spark-gate"], timeout=60)  # the test opens it
        client.close()
        yield sum(1 for _ in rows)

    lines: list[str] = []
    rdd = spark.sparkContext.parallelize(range(10), 2).mapPartitions(gated)
    with Progress(spark.sparkContext, lines.append, interval=0.05):
        result: list[int] = []
        job = threading.Thread(target=lambda: result.extend(rdd.collect()))
        job.start()
        wait_until(lambda: any("partitions 0/2 done" in x for x in lines),
                   message="a progress line")
        redis_client.rpush("test:spark-gate", 1, 1)
        job.join(timeout=60)
    assert sorted(result) == [5, 5]
    assert lines[0].startswith("partitions 0/2 done, ")


def test_importing_without_pyspark_names_the_extra() -> None:
    code = ("import sys; sys.modules['pyspark'] = None\n"
            "try:\n    import django_delayq.spark\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert "pip install 'django-delayq[spark]'" in out.stdout


def test_a_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    from django_delayq.spark import SparkSetupError
    from django_delayq.spark.session import find_java

    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(SparkSetupError, match="needs a Java 17\\+ runtime"):
        find_java()
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    with pytest.raises(SparkSetupError, match="does not exist"):
        find_java()


def test_spark_master_setting_and_its_check() -> None:
    from django_delayq.spark import resolve_master

    assert resolve_master() == "local[*]"
    assert resolve_master("spark://h:7077") == "spark://h:7077"
    with override_settings(DELAYQ={"SPARK_MASTER": "spark://cluster:7077"}):
        assert resolve_master() == "spark://cluster:7077"
        assert check_settings() == []
    for bad in ("local[0]", "cluster", 7077):
        with override_settings(DELAYQ={"SPARK_MASTER": bad}):
            assert [e.id for e in check_settings()] == ["django_delayq.E060"]


# -- job history report ---------------------------------------------------------------

T0 = dt.datetime(2025, 5, 1, 12, 0, tzinfo=UTC)


def _history() -> None:
    """101 completed jobs of emails.send with lateness 0.0..10.0 s (step 0.1) and duration
    0..100 s, so that with n = 101 every percentile falls on a value: p50 is the 51st
    value, p95 the 96th, p99 the 100th. Then 3 failed emails.bounce jobs and others."""
    from django_delayq.models import Job as JobRow

    rows = []
    for i in range(101):
        run_at = T0 + dt.timedelta(seconds=30 * i)
        started = run_at + dt.timedelta(milliseconds=100 * i)
        rows.append(JobRow(job_id=f"ok-{i}", queue="emails", task_name="emails.send",
                           status="completed", run_at=run_at, enqueued_at=run_at,
                           started_at=started, finished_at=started + dt.timedelta(seconds=i),
                           attempts=1))
    for i in range(3):
        run_at = T0 + dt.timedelta(minutes=i)
        rows.append(JobRow(job_id=f"bad-{i}", queue="emails", task_name="emails.bounce",
                           status="failed", run_at=run_at, enqueued_at=run_at,
                           started_at=run_at + dt.timedelta(seconds=20),
                           finished_at=run_at + dt.timedelta(seconds=21), attempts=3))
    rows.append(JobRow(job_id="later", queue="emails", task_name="emails.digest",
                       status="scheduled", run_at=T0 + dt.timedelta(days=1), enqueued_at=T0))
    rows.append(JobRow(job_id="r-1", queue="reports", task_name="reports.build",
                       status="completed", run_at=T0, enqueued_at=T0,
                       started_at=T0 + dt.timedelta(seconds=2),
                       finished_at=T0 + dt.timedelta(seconds=7), attempts=1))
    JobRow.objects.bulk_create(rows)


@pytest.mark.django_db
def test_report_gives_known_percentiles(spark: Any) -> None:
    from django_delayq.spark import build_report, jobs_from_orm

    _history()
    report = build_report(jobs_from_orm(spark), top=3)
    send = report.row("emails", "emails.send")
    assert (send["total"], send["completed"], send["failed"]) == (101, 101, 0)
    assert send["success_rate"] == 1.0
    assert (send["lateness_p50"], send["lateness_p95"], send["lateness_p99"]) == (5.0, 9.5, 9.9)
    assert (send["duration_p50"], send["duration_p95"], send["duration_p99"]) == (50, 95, 99)
    assert (send["lateness_max"], send["duration_max"]) == (10.0, 100.0)

    emails = report.row("emails")
    assert (emails["total"], emails["completed"], emails["failed"]) == (105, 101, 3)
    assert emails["success_rate"] == pytest.approx(101 / 104)
    # between values: 104 lateness values, p50 at position 51.5 of the sorted list
    assert emails["lateness_p50"] == pytest.approx((5.1 + 5.2) / 2, abs=1e-12)
    assert report.row("emails", "emails.bounce")["success_rate"] == 0.0

    reports = report.row("reports", "reports.build")
    assert (reports["lateness_p50"], reports["duration_p99"]) == (2.0, 5.0)
    assert reports["success_rate"] == 1.0
    assert emails["scheduled"] == 1
    assert report.row("emails", "emails.digest")["success_rate"] is None

    assert [r["job_id"] for r in report.latest] == ["bad-0", "bad-1", "bad-2"]
    assert [r["job_id"] for r in report.longest] == ["ok-100", "ok-99", "ok-98"]
    assert report.longest[0]["started_at"].tzinfo is not None
    # from the first finish (ok-0, at T0) to the last (ok-100, 3000 + 10 + 100 s later)
    assert report.window_minutes == pytest.approx(3110 / 60)
    assert send["throughput_per_min"] == pytest.approx(101 / report.window_minutes)
    assert emails["throughput_per_min"] == pytest.approx(104 / report.window_minutes)
    assert sum(r["completed"] + r["failed"] for r in report.timeline) == 105
    # one-minute buckets from 12:00 to 12:51 for each queue, quiet minutes as zero
    assert report.bucket_seconds == 60
    assert len(report.timeline) == 2 * 52
    assert report.timeline[-1]["bucket"] == T0 + dt.timedelta(minutes=51)


@pytest.mark.django_db
def test_report_command_from_orm_and_from_exports(spark: Any, tmp_path: Path) -> None:
    _history()
    out = io.StringIO()
    call_command("delayq_report", out=str(tmp_path / "orm"), stdout=out)
    text = out.getvalue()
    assert "emails.send" in text
    assert "97.1%" in text
    assert "100.0%" in text
    assert "Longest runs" in text
    files = {p.name for p in (tmp_path / "orm").iterdir()}
    assert files == {"summary.csv", "timeline.csv", "latest.csv", "longest.csv", "report.svg"}
    chart = ET.parse(tmp_path / "orm" / "report.svg").getroot()
    assert {t.text for t in chart.iter("{http://www.w3.org/2000/svg}text")} >= {
        "emails", "emails p95"}
    orm_rows = _summary_csv(tmp_path / "orm")

    parquet = tmp_path / "export.parquet"
    out = io.StringIO()
    call_command("delayq_report", export=str(parquet), stdout=out)
    assert f"exported 106 jobs to {parquet}" in out.getvalue()
    call_command("delayq_report", input=str(parquet), out=str(tmp_path / "pq"),
                 stdout=io.StringIO())
    assert _summary_csv(tmp_path / "pq") == orm_rows
    assert float(orm_rows[("emails", "emails.send")]["duration_p95"]) == 95.0

    out = io.StringIO()
    call_command("delayq_report", since="1h", stdout=out)  # T0 is long ago: nothing
    assert "(no jobs in the window)" in out.getvalue()
    with pytest.raises(CommandError, match="cannot read 'soon' as a duration"):
        call_command("delayq_report", since="soon")
    with pytest.raises(CommandError, match="does not look like a job export"):
        call_command("delayq_report", input=str(tmp_path / "orm" / "summary.csv"))


@pytest.mark.django_db
def test_history_loaders_agree(spark: Any, tmp_path: Path) -> None:
    from django_delayq.models import Job as JobRow
    from django_delayq.spark import export_jobs, jobs_from_file, jobs_from_orm
    from django_delayq.spark.history import orm_table

    _history()
    jsonl = tmp_path / "export.jsonl"
    with jsonl.open("w") as fh:
        for job in JobRow.objects.all():
            times = {k: getattr(job, k) and getattr(job, k).isoformat()
                     for k in ("run_at", "enqueued_at", "started_at", "finished_at")}
            fh.write(json.dumps({"job_id": job.job_id, "queue": job.queue,
                                 "task_name": job.task_name, "status": job.status,
                                 "attempts": job.attempts, **times}) + "\n")
    parquet = tmp_path / "export.parquet"
    export_jobs(parquet)
    columns = ["job_id", "queue", "status", "run_at", "started_at", "finished_at"]
    orm = sorted(tuple(r) for r in jobs_from_orm(spark).select(*columns).collect())
    assert len(orm) == 106
    assert sorted(tuple(r) for r in jobs_from_file(spark, parquet).select(*columns)
                  .collect()) == orm
    assert sorted(tuple(r) for r in jobs_from_file(spark, jsonl).select(*columns)
                  .collect()) == orm

    # the window keeps jobs whose last activity (finish, start, enqueue) is recent
    assert orm_table(since=dt.timedelta(hours=1)).num_rows == 0
    JobRow.objects.filter(job_id="later").update(enqueued_at=dt.datetime.now(UTC))
    assert orm_table(since=dt.timedelta(hours=1))["job_id"].to_pylist() == ["later"]


@pytest.mark.django_db
def test_the_history_of_a_project_without_time_zones_keeps_its_instants() -> None:
    """With USE_TZ off a row's times are naive in TIME_ZONE: the history (Arrow, then
    Spark) must not take them for UTC."""
    from django_delayq.conf import django_time
    from django_delayq.models import Job as JobRow
    from django_delayq.spark.history import orm_table

    with override_settings(USE_TZ=False, TIME_ZONE="America/New_York"):
        JobRow.objects.create(job_id="j", queue="default", task_name=RECORD,
                              status="completed", run_at=django_time(FUTURE),
                              enqueued_at=django_time(FUTURE),
                              finished_at=django_time(FUTURE + dt.timedelta(seconds=3)))
        table = orm_table()
    assert table["run_at"].to_pylist() == [FUTURE]
    assert table["finished_at"].to_pylist() == [FUTURE + dt.timedelta(seconds=3)]


@pytest.mark.django_db
def test_a_damaged_record_shows_in_the_history_and_the_report(spark: Any, redis_client: Any,
                                                              tmp_path: Path) -> None:
    """A job hash with unreadable fields is mirrored with their defaults and the damage
    named (``Job.damaged``); the history carries it and the report counts it."""
    from django_delayq.mirror import Mirror
    from django_delayq.models import Job as JobRow
    from django_delayq.spark import build_report, export_jobs, jobs_from_file, jobs_from_orm
    from django_delayq.spark.render import format_table
    from tests.testapp import tasks

    damaged = tasks.record.using(delay=600).enqueue("damaged")
    tasks.record.using(delay=600).enqueue("sound")
    job_key = Queue("default").broker.keys_for("default", damaged.id).job(damaged.id)
    redis_client.hset(job_key, mapping={"r": "not-a-time", "p": "high"})
    Mirror(block=0.1).run(burst=True)
    row = JobRow.objects.get(job_id=damaged.id)
    assert row.damaged == {"run_at": "not-a-time", "priority": "high"}
    assert (row.run_at, row.priority) == (None, 0)
    assert JobRow.objects.exclude(job_id=damaged.id).get().damaged is None

    history = jobs_from_orm(spark)
    found = {r["job_id"]: r["damaged"] for r in history.select("job_id", "damaged").collect()}
    assert json.loads(found[damaged.id]) == {"run_at": "not-a-time", "priority": "high"}
    assert list(found.values()).count(None) == 1
    export_jobs(tmp_path / "jobs.parquet")
    assert jobs_from_file(spark, tmp_path / "jobs.parquet").where(
        "damaged is not null").count() == 1
    report = build_report(history)
    assert (report.row("default")["damaged"], report.row("default")["total"]) == (1, 2)
    assert "1 jobs mirrored from damaged records" in format_table(report)


def _summary_csv(directory: Path) -> dict[tuple[str, str], dict[str, str]]:
    with (directory / "summary.csv").open() as fh:
        return {(r["queue"], r["task_name"]): r for r in csv.DictReader(fh)}


def test_enqueue_partition_is_usable_without_spark() -> None:
    """The executor function is plain Python over rows: a unit check of id derivation."""
    from django_delayq.spark.partition import EnqueuePlan, enqueue_partition

    plan = EnqueuePlan(redis_url=os.environ["DELAYQ_TEST_REDIS_URL"], task=RECORD,
                       args=((0, ("plain",), "tag"),), columns=("tag",), delay=60.0)
    run = partial(enqueue_partition, plan)
    first = next(run([("same",), ("same",), ("other",)]))
    assert (first.enqueued, first.duplicates) == (2, 1)
    again = next(run([("other",)]))
    assert (again.enqueued, again.duplicates) == (0, 1)


def test_a_retried_partition_adds_only_what_its_failed_attempt_did_not() -> None:
    """A Spark task that dies after sending some chunks is run again from the start."""
    from django_delayq.spark.partition import EnqueuePlan, enqueue_partition

    plan = EnqueuePlan(redis_url=os.environ["DELAYQ_TEST_REDIS_URL"], task=RECORD,
                       args=((0, ("plain",), "tag"),), columns=("tag",), delay=60.0,
                       chunk_size=100)
    rows = [(f"t{i}",) for i in range(250)]

    def dies_after_220() -> Iterator[tuple[str]]:
        for i, row in enumerate(rows):
            if i == 220:
                raise RuntimeError("executor lost")
            yield row

    with pytest.raises(RuntimeError, match="executor lost"):
        next(enqueue_partition(plan, dies_after_220()))
    assert Queue("default").counts()["scheduled"] == 200  # two chunks were sent
    retry = next(enqueue_partition(plan, rows))
    assert (retry.enqueued, retry.duplicates) == (50, 200)
    assert Queue("default").counts()["scheduled"] == 250
