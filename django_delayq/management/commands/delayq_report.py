"""``manage.py delayq_report``: job-history analytics on Spark.

Reads the mirrored jobs (through Spark's JDBC source on the executors, through the ORM on
the driver, or ``--input`` the job-history lake or an export), then prints per
queue and task: counts by status, success rate, start lateness and duration
p50/p95/p99 (exact), throughput per minute and the worst offenders; ``--out DIR``
also writes CSVs and a PNG chart. ``--export PATH`` writes the jobs to Parquet instead.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection


class Command(BaseCommand):
    help = "Report on job history per queue and task (lateness, durations, throughput)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", help="only jobs active in this window, e.g. 24h, "
                            "90m, 7d (default: all)")
        parser.add_argument("--input", help="a job-history lake (a directory of date= "
                            "partitions, or its URL: see delayq_export), or a .parquet, "
                            ".csv or .jsonl export of the job table (default: read the "
                            "table)")
        parser.add_argument("--source", choices=("auto", "jdbc", "orm"), default="auto",
                            help="how to read the job table: jdbc (the executors read id "
                            "slices in parallel; PostgreSQL), orm (the driver reads it "
                            "through Django), auto (jdbc on PostgreSQL when a JDBC driver "
                            "jar is found, else orm)")
        parser.add_argument("--partitions", type=int, help="id slices of a JDBC read "
                            "(default: one per 250,000 rows, at least Spark's parallelism)")
        parser.add_argument("--out", help="write summary.csv, timeline.csv, latest.csv, "
                            "longest.csv and report.svg into this directory")
        parser.add_argument("--master", help="Spark master URL (default "
                            "DELAYQ['SPARK_MASTER'], local[*])")
        parser.add_argument("--top", type=int, default=10,
                            help="worst offenders listed (latest starts, longest runs)")
        parser.add_argument("--export", metavar="PATH", help="write the job table (within "
                            "--since) to this Parquet file, and stop")

    def handle(self, *args: Any, **options: Any) -> None:
        try:  # PySpark: the optional extra "spark", imported when the command runs
            from django_delayq.spark import (
                build_report,
                export_jobs,
                jdbc,
                load_jobs,
                spark_session,
            )
            from django_delayq.spark.history import parse_since
            from django_delayq.spark.render import format_table, write_report
        except ImportError as exc:
            raise CommandError(str(exc)) from None
        try:
            since = parse_since(options["since"]) if options["since"] else None
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        if options["top"] < 0:
            raise CommandError("--top must be 0 or more")
        if options["partitions"] is not None and options["partitions"] < 1:
            raise CommandError("--partitions must be 1 or more")

        if options["export"]:
            rows = export_jobs(options["export"], since=since)
            self.stdout.write(f"exported {rows} jobs to {options['export']}")
            return

        source = self._input(options["input"]) if options["input"] else self._source(
            options["source"])
        config = jdbc.spark_config() if source == "jdbc" else {}
        spark = spark_session(options["master"], app_name="delayq_report", config=config)
        try:
            if source == "jdbc":
                df = jdbc.jobs_from_jdbc(spark, since=since,
                                         num_partitions=options["partitions"])
            elif source == "lake":
                from django_delayq.spark.lake import jobs_from_lake  # the spark extra

                df = jobs_from_lake(spark, options["input"], since=since)
            else:
                df = load_jobs(spark, options["input"], since=since)
        except (ValueError, FileNotFoundError) as exc:
            raise CommandError(str(exc)) from None
        report = build_report(df, since=since, top=options["top"])
        self.stdout.write(format_table(report))
        self._offenders("Latest starts (started_at - run_at)", report.latest, "lateness")
        self._offenders("Longest runs (finished_at - started_at)", report.longest, "duration")
        if options["out"]:
            paths = write_report(report, options["out"])
            self.stdout.write("wrote " + ", ".join(str(p) for p in paths))

    @staticmethod
    def _input(path: str) -> str:
        """``lake`` for a lake (a directory of ``date=`` partitions, or a URL), else
        ``file``."""
        from django_delayq.spark.lake import is_lake  # the spark extra: optional

        return "lake" if is_lake(path) else "file"

    def _source(self, asked: str) -> str:
        """``jdbc`` or ``orm``: what was asked, or for ``auto`` what this database allows."""
        from django_delayq.spark import jdbc  # the spark extra: optional


        if asked == "jdbc":
            try:
                jdbc.jdbc_source()
            except jdbc.JdbcUnavailable as exc:
                raise CommandError(str(exc)) from None
            return "jdbc"
        if asked == "auto" and connection.vendor == "postgresql" and jdbc.driver_jar():
            return "jdbc"
        return "orm"

    def _offenders(self, title: str, rows: list[dict[str, Any]], key: str) -> None:
        if not rows:
            return
        self.stdout.write(f"\n{title}:")
        for r in rows:
            self.stdout.write(f"  {r[key]:10.3f}s  {r['queue']}  {r['task_name']}  "
                              f"{r['job_id']}  {r['status']}")
