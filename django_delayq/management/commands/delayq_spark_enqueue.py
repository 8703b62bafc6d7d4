"""``manage.py delayq_spark_enqueue``: schedule one job per row of a file, with Spark.

Exit codes: 0 when every row was enqueued or already existed; 2 when some rows were
rejected (they are listed, and written to ``--rejected-out`` when given); 1 on errors.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

EXIT_REJECTED = 2


def _columns(text: str | None) -> list[str]:
    return [c.strip() for c in (text or "").split(",") if c.strip()]


class Command(BaseCommand):
    help = ("Enqueue one job per row of a Parquet, CSV or JSON-lines file, from Spark "
            "executors. Re-running it adds no duplicates.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--input", required=True, help="a .parquet, .csv or .jsonl file "
                            "(or a directory of Parquet files)")
        parser.add_argument("--format", choices=["parquet", "csv", "json"], default=None,
                            help="the input format (default: from the extension)")
        task = parser.add_mutually_exclusive_group(required=True)
        task.add_argument("--task", help="the registered task every row runs")
        task.add_argument("--task-column", help="a column holding each row's task name")
        when = parser.add_mutually_exclusive_group()
        when.add_argument("--run-at-column", help="a TIMESTAMP column, or text with a UTC "
                          "offset (ISO 8601)")
        when.add_argument("--delay", type=float, help="seconds from now, for every row")
        parser.add_argument("--args-columns", help="columns passed as positional arguments, "
                            "comma-separated, in order")
        parser.add_argument("--kwargs-columns", help="columns passed as keyword arguments of "
                            "the same name (or name=column), comma-separated")
        parser.add_argument("--job-id-column", help="a column of job ids (default: derived "
                            "from task, arguments and run_at)")
        parser.add_argument("--priority-column", help="an integer column of priorities")
        parser.add_argument("--priority", type=int, default=0, help="priority of every row")
        parser.add_argument("--queue", help="the queue (default: the task's queue)")
        parser.add_argument("--master", help="Spark master URL (default "
                            "DELAYQ['SPARK_MASTER'], local[*])")
        parser.add_argument("--chunk-size", type=int, default=1_000,
                            help="jobs per Redis round trip")
        parser.add_argument("--rejected-out", help="write every kept rejected row as JSON "
                            "lines to this file")
        parser.add_argument("--max-rejected", type=int, default=10_000,
                            help="rejected rows kept and listed (all are counted)")

    def handle(self, *args: Any, **options: Any) -> None:
        try:  # PySpark: the optional extra "spark", imported when the command runs
            from django_delayq.spark import enqueue_dataframe, spark_session
            from django_delayq.spark.history import detect_format
            from django_delayq.spark.progress import Progress
        except ImportError as exc:
            raise CommandError(str(exc)) from None

        path = options["input"]
        if "://" not in path and not Path(path).exists():
            raise CommandError(f"no such file: {path}")
        try:
            fmt = options["format"] or detect_format(path)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        kwargs: dict[str, str] = {}
        for item in _columns(options["kwargs_columns"]):
            name, _, column = item.partition("=")
            kwargs[name] = column or name

        spark = spark_session(options["master"], app_name="delayq_spark_enqueue")
        df = self._read(spark, path, fmt, options["run_at_column"])
        write = self._progress_writer()
        try:
            with Progress(spark.sparkContext, write):
                summary = enqueue_dataframe(
                    df, options["task"], task_column=options["task_column"],
                    args=_columns(options["args_columns"]), kwargs=kwargs,
                    run_at=options["run_at_column"], delay=options["delay"],
                    priority=options["priority_column"] or options["priority"],
                    job_id=options["job_id_column"], queue=options["queue"],
                    chunk_size=options["chunk_size"], max_rejected=options["max_rejected"],
                )
        except (ValueError, TypeError, LookupError) as exc:
            raise CommandError(str(exc)) from None
        self._end_progress()
        rate = summary.rows / summary.seconds if summary.seconds else 0.0
        self.stdout.write(
            f"enqueued={summary.enqueued} duplicates={summary.duplicates} "
            f"rejected={summary.rejected} rows={summary.rows} partitions={summary.partitions} "
            f"in {summary.seconds:.1f}s ({rate:,.0f} rows/s)"
        )
        for rejected in summary.rejected_rows[:20]:
            self.stdout.write(f"  rejected: {rejected.reason} | "
                              f"{json.dumps(rejected.row, default=str)}")
        if summary.rejected > 20:
            self.stdout.write(f"  ... {summary.rejected - 20} more rejected rows")
        if options["rejected_out"]:
            with open(options["rejected_out"], "w") as fh:
                for rejected in summary.rejected_rows:
                    fh.write(json.dumps({"reason": rejected.reason, "row": rejected.row},
                                        default=str) + "\n")
        if summary.rejected:
            sys.exit(EXIT_REJECTED)

    def _read(self, spark: Any, path: str, fmt: str, run_at: str | None) -> Any:
        """Read the input; text formats keep ``run_at`` as text, so naive times stay
        detectable (Spark would read them in the session time zone)."""
        from pyspark.sql import types as T  # the spark extra: optional


        reader = spark.read
        if fmt == "csv":
            reader = reader.option("header", True).option("inferSchema", True)
        df = reader.format(fmt).load(path)
        if fmt != "parquet" and run_at and run_at in df.columns and not isinstance(
                df.schema[run_at].dataType, T.StringType):
            schema = T.StructType([
                T.StructField(f.name, T.StringType(), True) if f.name == run_at else f
                for f in df.schema.fields
            ])
            df = spark.read.schema(schema).options(
                **({"header": True} if fmt == "csv" else {})).format(fmt).load(path)
        return df

    def _progress_writer(self) -> Any:
        tty = self.stdout.isatty()

        def write(text: str) -> None:
            if tty:
                self.stdout.write(f"\r{text}   ", ending="")
                self.stdout.flush()
            else:
                self.stdout.write(text)

        self._tty = tty
        return write

    def _end_progress(self) -> None:
        if self._tty:
            self.stdout.write("")
