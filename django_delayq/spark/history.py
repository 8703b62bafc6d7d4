"""The job history as a Spark DataFrame: from the mirrored ``Job`` table or a file export.

Every loader returns the same columns (:data:`HISTORY_SCHEMA`), timestamps as Spark
TIMESTAMPs (instants). ``damaged`` shows a row mirrored from a damaged job record: the
fields that could not be read and what was found there (JSON), the row holding their
defaults; the report counts such rows. The ORM is read on the driver in chunks into an Arrow table;
:func:`export_jobs` writes the same rows to Parquet for ``delayq_report --input``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from django_delayq.engine.logfields import log

logger = logging.getLogger(__name__)

FIELDS: tuple[tuple[str, T.DataType, pa.DataType], ...] = (
    ("job_id", T.StringType(), pa.string()),
    ("queue", T.StringType(), pa.string()),
    ("task_name", T.StringType(), pa.string()),
    ("status", T.StringType(), pa.string()),
    ("priority", T.IntegerType(), pa.int32()),
    ("run_at", T.TimestampType(), pa.timestamp("us", tz="UTC")),
    ("enqueued_at", T.TimestampType(), pa.timestamp("us", tz="UTC")),
    ("started_at", T.TimestampType(), pa.timestamp("us", tz="UTC")),
    ("finished_at", T.TimestampType(), pa.timestamp("us", tz="UTC")),
    ("attempts", T.IntegerType(), pa.int32()),
    ("max_attempts", T.IntegerType(), pa.int32()),
    ("worker", T.StringType(), pa.string()),
    ("error", T.StringType(), pa.string()),
    # JSON {field: what was found} of a job record that could not be fully read, else null
    ("damaged", T.StringType(), pa.string()),
)
COLUMNS = tuple(name for name, _, _ in FIELDS)
_DAMAGED = COLUMNS.index("damaged")
HISTORY_SCHEMA = T.StructType([T.StructField(name, t, True) for name, t, _ in FIELDS])
ARROW_SCHEMA = pa.schema([(name, t) for name, _, t in FIELDS])
FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json",
           ".jsonl": "json", ".ndjson": "json"}
_SINCE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}


def parse_since(text: str) -> dt.timedelta:
    """``"24h"``, ``"30m"``, ``"7d"``, ``"90s"``, ``"2w"`` as a timedelta."""
    match = _SINCE_RE.match(text or "")
    if not match:
        raise ValueError(f"cannot read {text!r} as a duration: write a number and a unit "
                         "s, m, h, d or w, e.g. 24h")
    return dt.timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])


def detect_format(path: str | Path) -> str:
    """The reader for ``path`` from its extension (a directory: Parquet, as Spark writes)."""
    p = Path(path)
    if p.is_dir():
        return "parquet"
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise ValueError(f"cannot tell the format of {str(path)!r}: use a .parquet, .csv or "
                         ".json/.jsonl (JSON lines) file, or pass the format")
    return fmt


def _queryset(since: dt.timedelta | None, queryset: Any = None) -> Any:
    from django.db.models.functions import Coalesce
    from django.utils import timezone

    from django_delayq.models import Job

    qs = Job.objects.all() if queryset is None else queryset
    if since is not None:
        qs = qs.annotate(
            _last=Coalesce("finished_at", "started_at", "enqueued_at", "run_at")
        ).filter(_last__gte=timezone.now() - since)
    return qs.order_by().values_list(*COLUMNS)


def _batches(since: dt.timedelta | None, queryset: Any, size: int) -> Iterator[pa.RecordBatch]:
    from django_delayq.conf import aware_time  # Django is optional here

    chunk: list[tuple[Any, ...]] = []
    for row in _queryset(since, queryset).iterator(chunk_size=size):
        # USE_TZ = False: the row's times are naive in TIME_ZONE, which Arrow would take
        # for UTC
        chunk.append(tuple(aware_time(v) if isinstance(v, dt.datetime) else v
                           for v in row))
        if len(chunk) >= size:
            yield _to_batch(chunk)
            chunk = []
    if chunk:
        yield _to_batch(chunk)


def _to_batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    columns[_DAMAGED] = tuple(None if not v else json.dumps(v, sort_keys=True)
                              for v in columns[_DAMAGED])
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=t) for col, (_, _, t) in zip(columns, FIELDS, strict=True)],
        schema=ARROW_SCHEMA,
    )


def orm_table(since: dt.timedelta | None = None, queryset: Any = None,
              batch_size: int = 50_000) -> pa.Table:
    """The mirrored jobs (``django_delayq.models.Job``) as an Arrow table."""
    batches = list(_batches(since, queryset, batch_size))
    return pa.Table.from_batches(batches, schema=ARROW_SCHEMA)


def export_jobs(path: str | Path, *, since: dt.timedelta | None = None, queryset: Any = None,
                batch_size: int = 50_000) -> int:
    """Write the mirrored jobs to a Parquet file at ``path``; return the number of rows."""
    rows = 0
    with pq.ParquetWriter(str(path), ARROW_SCHEMA) as writer:
        for batch in _batches(since, queryset, batch_size):
            writer.write_batch(batch)
            rows += batch.num_rows
    log(logger, logging.INFO, "exported jobs", rows=rows, path=path)
    return rows


def jobs_from_orm(spark: SparkSession, *, since: dt.timedelta | None = None,
                  queryset: Any = None) -> DataFrame:
    """The mirrored jobs as a DataFrame (read through the ORM on the driver, via Arrow)."""
    table = orm_table(since, queryset)
    try:
        return spark.createDataFrame(table)
    except (TypeError, ValueError):  # PySpark before 4.0 takes no Arrow table
        return spark.createDataFrame([tuple(r.values()) for r in table.to_pylist()],
                                     HISTORY_SCHEMA)


def jobs_from_file(spark: SparkSession, path: str | Path, *, fmt: str | None = None,
                   since: dt.timedelta | None = None) -> DataFrame:
    """Jobs from a Parquet, CSV (with header) or JSON-lines export of the job table.

    Columns missing from the file are null; timestamps in text files must carry a UTC
    offset (text without one is read in the session time zone, UTC by default).
    """
    fmt = fmt or detect_format(path)
    reader = spark.read
    if fmt == "csv":
        reader = reader.option("header", True)
    if not Path(path).exists() and "://" not in str(path):
        raise FileNotFoundError(f"no such file: {path}")
    raw = reader.format(fmt).load(str(path))
    present = set(raw.columns)
    if not {"queue", "task_name", "status"} <= present:
        raise ValueError(f"{path} does not look like a job export: it needs at least the "
                         f"columns queue, task_name and status; it has {', '.join(raw.columns)}")
    df = raw.select(*[
        (F.col(name) if name in present else F.lit(None)).cast(dtype).alias(name)
        for name, dtype, _ in FIELDS
    ])
    return filter_since(df, since)


def seconds_between(later: str | Column, earlier: str | Column) -> Column:
    """Seconds from ``earlier`` to ``later`` (TIMESTAMP columns, or their names), to the
    microsecond: lateness and duration, whatever the jobs were read from."""
    return (F.unix_micros(later) - F.unix_micros(earlier)) / F.lit(1_000_000.0)


def filter_since(df: DataFrame, since: dt.timedelta | None) -> DataFrame:
    """Jobs whose last activity (finish, else start, enqueue, run_at) is within ``since``."""
    if since is None:
        return df
    cutoff = dt.datetime.now(dt.UTC) - since
    last = F.coalesce("finished_at", "started_at", "enqueued_at", "run_at")
    return df.where(last >= F.lit(cutoff))


def load_jobs(spark: SparkSession, path: str | Path | None = None, *,
              since: dt.timedelta | None = None) -> DataFrame:
    """Jobs from the file at ``path``, or from the ORM when ``path`` is ``None``."""
    if path is None:
        return jobs_from_orm(spark, since=since)
    return jobs_from_file(spark, path, since=since)
