"""The Spark pipeline on a standalone cluster: a master and two workers in other JVMs.

The executors run in processes the workers start, with django-delayq on their path and
no Django settings: bulk scheduling and both history readers must work there as they do
in ``local[*]``. The JDBC reader needs PostgreSQL: its tests (``tests/pg_spark_jdbc.py``)
run in a subprocess on the PostgreSQL settings, against this cluster.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from django_delayq import Queue
from tests.conftest import worker_env
from tests.spark_cluster import SparkCluster, executor_pythonpath
from tests.test_spark import RECORD, _history

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def cluster() -> Iterator[SparkCluster]:
    try:
        # Two cores each: this module's application takes one executor (one core) on
        # each worker, and the JDBC test's own application the other two.
        running = SparkCluster(workers=2, cores=2, memory="1200m").start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"a standalone Spark cluster cannot start here: {exc}")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def spark(cluster: SparkCluster) -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from django_delayq.spark import spark_session

    active = SparkSession.getActiveSession()
    if active is not None:  # another module's local session
        active.stop()
    session = spark_session(cluster.master_url, app_name="delayq-cluster-tests", config={
        "spark.ui.enabled": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.session.timeZone": "UTC",
        "spark.executorEnv.PYTHONPATH": executor_pythonpath(),
        "spark.pyspark.python": sys.executable,
    })
    yield session
    session.stop()


def test_executors_run_in_other_processes_without_django(spark: Any,
                                                         cluster: SparkCluster) -> None:
    def probe(_: Iterator[Any]) -> Iterator[tuple[int, int, bool]]:
        import os as executor_os
        import sys as executor_sys

        yield executor_os.getpid(), executor_os.getppid(), "django" in executor_sys.modules

    # barrier mode starts both tasks at once: with one core per executor, one in each
    found = spark.sparkContext.parallelize(range(2), 2).barrier().mapPartitions(probe).collect()
    assert len(found) == 2
    assert all(pid != os.getpid() for pid, _, _ in found)
    assert len({parent for _, parent, _ in found}) == 2  # two executors' Python daemons
    assert [imported for _, _, imported in found] == [False, False]
    app = cluster.state()["activeapps"][0]
    assert app["name"] == "delayq-cluster-tests"
    assert app["cores"] == 2


def test_bulk_scheduling_on_the_cluster_is_safe_to_rerun(spark: Any) -> None:
    from pyspark.sql import functions as F

    from django_delayq.spark import enqueue_dataframe

    df = spark.range(20_000, numPartitions=4).select(
        F.concat(F.lit("row-"), F.col("id").cast("string")).alias("tag"))
    first = enqueue_dataframe(df, RECORD, args=["tag"], delay=3600)
    assert (first.enqueued, first.duplicates, first.rejected) == (20_000, 0, 0)
    again = enqueue_dataframe(df.repartition(3), RECORD, args=["tag"], delay=3600)
    assert (again.enqueued, again.duplicates, again.rejected) == (0, 20_000, 0)
    assert Queue("default").counts()["scheduled"] == 20_000


@pytest.mark.django_db
def test_the_orm_report_on_the_cluster(spark: Any) -> None:
    from django_delayq.spark import build_report, jobs_from_orm

    _history()
    report = build_report(jobs_from_orm(spark), top=3)
    send = report.row("emails", "emails.send")
    assert (send["total"], send["completed"]) == (101, 101)
    assert (send["lateness_p50"], send["lateness_p99"]) == (5.0, 9.9)
    assert [r["job_id"] for r in report.longest] == ["ok-100", "ok-99", "ok-98"]


@pytest.mark.postgres
@pytest.mark.timeout(900)  # a pytest of its own, with Spark jobs on the cluster
def test_the_jdbc_reader_on_the_cluster_and_postgresql(cluster: SparkCluster) -> None:
    env = worker_env(DJANGO_SETTINGS_MODULE="tests.settings_postgres",
                     DELAYQ_TEST_SPARK_MASTER=cluster.master_url)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--ds=tests.settings_postgres", "-p",
         "no:cacheprovider", "--timeout", "580", "-q", "tests/pg_spark_jdbc.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert "2 passed" in output, output


def test_the_lake_report_on_the_cluster(spark: Any, broker: Any, tmp_path: Path) -> None:
    import datetime as dt

    import numpy as np

    from django_delayq.engine.keys import QueueKeys
    from django_delayq.lake import Exporter
    from django_delayq.spark import build_report, jobs_from_lake
    from tests.lake_events import generate

    keys = QueueKeys("dq", "lake")
    made = generate(broker, "lake.work", keys, 5_000,
                    t0=dt.datetime(2026, 1, 5, 12, tzinfo=dt.UTC))
    Exporter(str(tmp_path), broker=broker, queues=["lake"], batch_size=5).run(burst=True)
    jobs = jobs_from_lake(spark, str(tmp_path))
    report = build_report(jobs, top=0)
    row = report.row("lake", "lake.work")
    assert (row["total"], row["completed"]) == (5_000, 5_000)
    want = np.percentile(np.array(made.lateness), [50, 95, 99], method="linear")
    got = [row["lateness_p50"], row["lateness_p95"], row["lateness_p99"]]
    assert got == pytest.approx(list(want), rel=1e-12, abs=1e-9)

    def probe(rows: Iterator[Any]) -> Iterator[tuple[int, int, bool]]:
        import os as executor_os
        import sys as executor_sys

        yield (executor_os.getpid(), sum(1 for _ in rows),
               "django" in executor_sys.modules)

    found = jobs.rdd.mapPartitions(probe).collect()
    assert sum(n for _, n, _ in found) == 5_000
    assert all(pid != os.getpid() and not imported for pid, _, imported in found)


@pytest.mark.timeout(900)  # three JVMs of its own (two drivers and their executors)
def test_the_commands_run_on_the_cluster_as_a_user_runs_them(cluster: SparkCluster,
                                                             broker: Any,
                                                             tmp_path: Path) -> None:
    """Fresh ``manage.py delayq_spark_enqueue`` and ``manage.py delayq_report`` processes
    with ``--master spark://...``, configured as a cluster's users configure Spark: a
    ``spark-defaults.conf`` in ``SPARK_CONF_DIR`` (where executors find Python and the
    project). Each is an application of the master, and does its work there."""
    import csv
    import datetime as dt

    import numpy as np

    from django_delayq.engine.keys import QueueKeys
    from django_delayq.lake import Exporter
    from tests.lake_events import generate

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("\n".join(f"{k} {v}" for k, v in {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": "512m",
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "4",
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYTHONPATH": executor_pythonpath(),
    }.items()) + "\n")
    env = worker_env(SPARK_CONF_DIR=str(conf))

    def manage(*args: str) -> str:
        run = subprocess.run([sys.executable, "-m", "django", *args, "--master",
                              cluster.master_url], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=600)
        assert run.returncode == 0, run.stdout + run.stderr
        return run.stdout

    rows = tmp_path / "rows.csv"
    with rows.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["tag"])
        writer.writerows([f"row-{i}"] for i in range(3_000))
    manage("delayq_spark_enqueue", "--input", str(rows), "--task", RECORD,
           "--args-columns", "tag", "--delay", "3600")
    assert Queue("default").counts()["scheduled"] == 3_000

    keys = QueueKeys("dq", "lake")
    made = generate(broker, "lake.work", keys, 4_000,
                    t0=dt.datetime(2026, 1, 5, 12, tzinfo=dt.UTC))
    Exporter(str(tmp_path / "lake"), broker=broker, queues=["lake"]).run(burst=True)
    out = manage("delayq_report", "--input", str(tmp_path / "lake"), "--out",
                 str(tmp_path / "report"))
    assert "lake.work" in out
    with (tmp_path / "report" / "summary.csv").open() as fh:
        summary = {(r["queue"], r["task_name"]): r for r in csv.DictReader(fh)}
    row = summary[("lake", "lake.work")]
    assert (row["total"], row["completed"], row["waiting"]) == ("4000", "4000", "0")
    want = np.percentile(np.array(made.lateness), [50, 95, 99], method="linear")
    got = [float(row[f"lateness_p{p}"]) for p in (50, 95, 99)]
    assert got == pytest.approx(list(want), abs=1e-6)  # the CSV rounds to 6 places
    assert {p.name for p in (tmp_path / "report").iterdir()} >= {"summary.csv", "report.svg"}

    apps = [app["name"] for app in cluster.state()["completedapps"]]
    assert apps.count("delayq_spark_enqueue") == 1
    assert apps.count("delayq_report") == 1
