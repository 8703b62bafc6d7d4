"""The JDBC reader on PostgreSQL, run by ``tests/test_spark_cluster.py`` in a subprocess.

Not collected on its own (its name does not start with ``test_``): it needs the
PostgreSQL settings (``--ds=tests.settings_postgres``) and reads the Spark master from
``DELAYQ_TEST_SPARK_MASTER`` (the test cluster's, or ``local[2]``).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from tests.spark_cluster import executor_pythonpath
from tests.test_spark import T0, _history

pytestmark = [pytest.mark.spark, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parent.parent
EXTRA_ROWS = 5_000


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from django_delayq.spark import jdbc, spark_session

    master = os.environ.get("DELAYQ_TEST_SPARK_MASTER", "local[2]")
    session = spark_session(master, app_name="delayq-jdbc-tests", config={
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.executorEnv.PYTHONPATH": executor_pythonpath(),
        "spark.pyspark.python": sys.executable,
        "spark.sql.session.timeZone": "UTC",
        **jdbc.spark_config(),
    })
    yield session
    session.stop()


def _more_history() -> None:
    """EXTRA_ROWS completed jobs of one task, so the id range spans several slices."""
    from django_delayq.models import Job as JobRow

    JobRow.objects.bulk_create(
        JobRow(job_id=f"bulk-{i}", queue="bulk", task_name="bulk.work", status="completed",
               run_at=T0 + dt.timedelta(seconds=i), enqueued_at=T0,
               started_at=T0 + dt.timedelta(seconds=i, milliseconds=i % 997),
               finished_at=T0 + dt.timedelta(seconds=i + 1, milliseconds=i % 991),
               attempts=1 + i % 3, worker=f"w{i % 5}")
        for i in range(EXTRA_ROWS))


def _rows(report: Any) -> dict[str, Any]:
    key = lambda r: tuple(str(v) for v in r.values())  # noqa: E731
    return {"summary": sorted(report.summary, key=key),
            "timeline": sorted(report.timeline, key=key),
            "latest": report.latest, "longest": report.longest,
            "jobs": report.jobs, "window": report.window_minutes}


@pytest.mark.django_db(transaction=True)  # committed rows: the executors read them
def test_the_jdbc_report_equals_the_orm_report(spark: Any, tmp_path: Path) -> None:
    from django_delayq.spark import build_report, jobs_from_jdbc, jobs_from_orm

    assert connection.vendor == "postgresql"
    _history()
    _more_history()
    via_jdbc = jobs_from_jdbc(spark, num_partitions=4)
    assert via_jdbc.rdd.getNumPartitions() == 4
    assert via_jdbc.count() == 106 + EXTRA_ROWS
    orm = build_report(jobs_from_orm(spark), top=5)
    jdbc = build_report(via_jdbc, top=5)
    assert _rows(jdbc) == _rows(orm)
    assert jdbc.row("emails", "emails.send")["duration_p95"] == 95

    # the command takes the JDBC path by itself on PostgreSQL when a driver jar is found
    from django_delayq.management.commands.delayq_report import Command

    assert Command()._source("auto") == "jdbc"
    for source in ("auto", "orm"):
        call_command("delayq_report", source=source, out=str(tmp_path / source),
                     stdout=io.StringIO())
    tables = {source: (tmp_path / source / "summary.csv").read_text()
              for source in ("auto", "orm")}
    assert tables["auto"] == tables["orm"]
    with (tmp_path / "auto" / "summary.csv").open() as fh:
        bulk = next(r for r in csv.DictReader(fh) if r["task_name"] == "bulk.work")
    assert int(bulk["total"]) == EXTRA_ROWS


@pytest.mark.django_db(transaction=True)
def test_a_jdbc_window_and_an_empty_table(spark: Any) -> None:
    from django_delayq.models import Job as JobRow
    from django_delayq.spark import jobs_from_jdbc

    assert jobs_from_jdbc(spark).count() == 0
    _history()
    assert jobs_from_jdbc(spark, since=dt.timedelta(hours=1)).count() == 0
    JobRow.objects.filter(job_id="later").update(enqueued_at=dt.datetime.now(dt.UTC))
    found = jobs_from_jdbc(spark, since=dt.timedelta(hours=1)).select("job_id").collect()
    assert [r.job_id for r in found] == ["later"]
