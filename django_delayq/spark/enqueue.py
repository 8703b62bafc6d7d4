"""``enqueue_dataframe``: schedule one job per row of a Spark DataFrame.

The driver checks the arguments, reads the defaults it needs from ``settings.DELAYQ``
(when Django is configured) and builds an :class:`~.partition.EnqueuePlan`; the
executors enqueue through the engine alone, one round trip per chunk. Job ids come
from a column or are derived from the job itself, so re-running a Spark task or the
whole job adds no duplicates: the engine skips ids that exist and counts them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from django_delayq.engine import EngineConfig, validation
from django_delayq.engine.errors import UnknownTask
from django_delayq.engine.keys import JOB_ID_RE
from django_delayq.engine.logfields import log
from django_delayq.engine.urls import sentinel_url_from_cache

from .convert import PLAIN, Spec
from .partition import EnqueuePlan, PartitionResult, enqueue_partition

logger = logging.getLogger(__name__)

INTEGER_TYPES = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


@dataclass(slots=True)
class RejectedRow:
    """A row that did not become a job: its columns (as used) and the reason."""

    reason: str
    row: dict[str, Any]


@dataclass(slots=True)
class EnqueueSummary:
    """What :func:`enqueue_dataframe` did.

    ``enqueued + duplicates + rejected`` is the number of rows. ``rejected_rows`` holds
    the first ``max_rejected`` refused rows with their reasons (``rejected`` counts all).
    """

    enqueued: int = 0
    duplicates: int = 0
    rejected: int = 0
    rejected_rows: list[RejectedRow] = field(default_factory=list)
    queues: dict[str, int] = field(default_factory=dict)
    partitions: int = 0
    seconds: float = 0.0

    @property
    def rows(self) -> int:
        return self.enqueued + self.duplicates + self.rejected

    def rejected_dataframe(self, spark: SparkSession) -> DataFrame:
        """The kept rejected rows as a DataFrame of ``reason`` and ``row`` (JSON text)."""
        schema = T.StructType([T.StructField("reason", T.StringType(), False),
                               T.StructField("row", T.StringType(), False)])
        data = [(r.reason, json.dumps(r.row, default=str)) for r in self.rejected_rows]
        return spark.createDataFrame(data, schema)

    def merge(self, part: PartitionResult, limit: int) -> None:
        self.enqueued += part.enqueued
        self.duplicates += part.duplicates
        self.rejected += part.rejected
        self.partitions += 1
        for queue, n in part.queues.items():
            self.queues[queue] = self.queues.get(queue, 0) + n
        room = limit - len(self.rejected_rows)
        self.rejected_rows += [RejectedRow(reason, row) for reason, row in part.samples[:room]]


def spec_for(data_type: T.DataType) -> Spec:
    """How values of ``data_type`` become JSON on the executors (see ``convert``)."""
    if isinstance(data_type, T.TimestampType):
        return ("timestamp",)
    if isinstance(data_type, T.BinaryType):
        return ("binary",)
    if isinstance(data_type, T.ArrayType):
        return ("array", spec_for(data_type.elementType))
    if isinstance(data_type, T.MapType):
        return ("map", isinstance(data_type.keyType, T.StringType | T.CharType | T.VarcharType),
                spec_for(data_type.valueType))
    if isinstance(data_type, T.StructType):
        return ("struct", tuple((f.name, spec_for(f.dataType)) for f in data_type.fields))
    return PLAIN


def _django_settings() -> Any | None:
    """``django_delayq.conf.conf`` when Django is configured, else ``None``."""
    try:
        from django.conf import settings

        settings.DELAYQ  # noqa: B018 - raises ImproperlyConfigured when not configured
    except AttributeError:
        pass
    except Exception:
        return None
    from django_delayq.conf import conf

    return conf


def _registered_tasks() -> dict[str, Any] | None:
    """Registered tasks by name, when Django's apps are loaded (else ``None``)."""
    try:
        from django.apps import apps

        if not apps.ready:
            return None
        from django_delayq.task import registry
    except Exception:
        return None
    return {t.name: t for t in registry.tasks()}


def _engine_config() -> EngineConfig:
    """The engine settings of the project: its one engine config, whole."""
    from django_delayq.connection import engine_config  # Django is optional here

    return engine_config()


def _redis_url(conf: Any) -> str:
    alias = conf.CACHE_ALIAS
    if not alias:
        return str(conf.REDIS_URL)
    from django.conf import settings

    cache = settings.CACHES.get(alias, {})
    location = cache.get("LOCATION")
    if isinstance(location, list | tuple) and location:
        location = location[0]
    if not isinstance(location, str) or "://" not in location:
        raise ValueError(f"cannot tell the Redis URL of cache {alias!r} "
                         "(DELAYQ['CACHE_ALIAS']): pass redis_url=")
    # A django-redis Sentinel cache's LOCATION names the service, not a host.
    return sentinel_url_from_cache(location, cache.get("OPTIONS") or {}) or location


def _column(df: DataFrame, name: str, role: str) -> tuple[Any, T.DataType]:
    fields = {f.name: f.dataType for f in df.schema.fields}
    if name not in fields:
        raise ValueError(f"{role} column {name!r} is not in the DataFrame; its columns are "
                         f"{', '.join(fields) or '(none)'}")
    return F.col(f"`{name.replace('`', '``')}`"), fields[name]


def enqueue_dataframe(
    df: DataFrame,
    task: str | None = None,
    *,
    task_column: str | None = None,
    args: Sequence[str] = (),
    kwargs: Mapping[str, str] | Sequence[str] | None = None,
    run_at: str | None = None,
    delay: float | dt.timedelta | None = None,
    priority: str | int = 0,
    job_id: str | None = None,
    job_id_prefix: str = "spark-",
    queue: str | None = None,
    max_attempts: int | None = None,
    redis_url: str | None = None,
    prefix: str | None = None,
    known_tasks: Iterable[str] | None = None,
    chunk_size: int = 1_000,
    max_rejected: int = 10_000,
) -> EnqueueSummary:
    """Enqueue one job per row of ``df`` from the Spark executors; return the totals.

    - ``task``: the task name of every row, or ``task_column``: a column holding it.
      Names are checked against ``known_tasks`` when given, else against the registry
      when Django is configured (an unknown fixed ``task`` raises :class:`UnknownTask`;
      a row naming an unknown task is rejected).
    - ``args``: columns passed as positional arguments, in order; ``kwargs``: a mapping
      ``{argument name: column}`` (or a list of columns, each named after itself).
    - ``run_at``: a TIMESTAMP column (an instant: read exactly, whatever the session
      time zone) or a text column of ISO 8601 times with a UTC offset; or ``delay``
      (seconds or timedelta) for every row; neither: due now.
    - ``priority``: an int for every row, or an integer column.
    - ``job_id``: a column of job ids; without one, each id is ``job_id_prefix`` plus a
      hash of task, arguments and run_at (or delay), so identical rows are one job.
    - ``queue``: default the task's registered queue, else ``DELAYQ["DEFAULT_QUEUE"]``.
    - ``redis_url``, ``prefix``: default ``DELAYQ["REDIS_URL"]`` and ``DELAYQ["PREFIX"]``,
      read here on the driver; executors never need Django.

    Rows that cannot be jobs (null or naive run_at, a value with no JSON form, a bad
    priority or job id, an unknown task) are counted in ``rejected`` and the first
    ``max_rejected`` come back in ``rejected_rows`` with their reasons.
    """
    started = time.monotonic()
    if (task is None) == (task_column is None):
        raise ValueError("give task (a task name) or task_column (a column of names), "
                         "not both and not neither")
    if run_at is not None and delay is not None:
        raise ValueError("give run_at (a column) or delay, not both")
    if chunk_size < 1:
        raise ValueError("chunk_size must be at least 1")
    if not JOB_ID_RE.match(job_id_prefix + "0"):
        raise ValueError(f"job_id_prefix {job_id_prefix!r} has characters job ids cannot "
                         "hold (use A-Z a-z 0-9 _ . : @ + = / -)")
    if delay is not None:
        validation.delay_ms(delay)
    if max_attempts is not None:
        validation.check_max_attempts(max_attempts)
    if queue is not None:
        validation.validate_queue_name(queue)

    conf = _django_settings()
    tasks = _registered_tasks() if conf is not None else None
    allowed: frozenset[str] | None = None
    if known_tasks is not None:
        allowed = frozenset(known_tasks)
    elif tasks is not None:
        allowed = frozenset(tasks)
    if task is not None:
        validation.check_task_name(task)
        if allowed is not None and task not in allowed:
            raise UnknownTask(f"no task named {task!r} is registered (known: "
                              f"{', '.join(sorted(allowed)) or 'none'}); nothing was enqueued")

    if redis_url is None:
        if conf is None:
            raise ValueError("pass redis_url= (Django is not configured, so "
                             "DELAYQ['REDIS_URL'] cannot be read)")
        redis_url = _redis_url(conf)
    default_queue = conf.DEFAULT_QUEUE if conf is not None else "default"
    task_queues = {name: t.queue_name for name, t in (tasks or {}).items()}
    task_attempts = {name: t.attempts_allowed for name, t in (tasks or {}).items()}
    for name in task_queues.values():
        validation.validate_queue_name(name)

    selected: list[Any] = []
    names: list[str] = []

    def take(column: Any, name: str) -> int:
        selected.append(column.alias(f"_c{len(selected)}"))
        names.append(name)
        return len(selected) - 1

    task_pos = None
    if task_column is not None:
        col, dtype = _column(df, task_column, "task")
        if not isinstance(dtype, T.StringType):
            raise TypeError(f"task column {task_column!r} must hold strings, not {dtype}")
        task_pos = take(col, task_column)

    arg_plan = []
    for name in args:
        col, dtype = _column(df, name, "argument")
        arg_plan.append((take(col, name), spec_for(dtype), name))
    kwarg_items = (list(kwargs.items()) if isinstance(kwargs, Mapping)
                   else [(c, c) for c in (kwargs or ())])
    kwarg_plan = []
    for arg_name, column in kwarg_items:
        if not isinstance(arg_name, str) or not arg_name.isidentifier():
            raise ValueError(f"keyword argument name {arg_name!r} is not an identifier")
        col, dtype = _column(df, column, "argument")
        kwarg_plan.append((arg_name, take(col, column), spec_for(dtype)))

    if task is not None and tasks is not None and task in tasks:
        # the function must take these arguments: a mismatch fails here, not on a worker
        tasks[task].check_arguments([None] * len(arg_plan), {n: None for n, _, _ in kwarg_plan})

    run_at_kind = run_at_pos = None
    if run_at is not None:
        col, dtype = _column(df, run_at, "run_at")
        if isinstance(dtype, T.TimestampType):
            run_at_kind, run_at_pos = "micros", take(F.unix_micros(col), run_at)
        elif isinstance(dtype, T.StringType | T.VarcharType | T.CharType):
            run_at_kind, run_at_pos = "text", take(col, run_at)
        else:
            raise TypeError(
                f"run_at column {run_at!r} is {dtype.simpleString()}: use a TIMESTAMP column "
                "(an instant) or text with a UTC offset; TIMESTAMP_NTZ and DATE hold no time "
                "zone: convert them with to_utc_timestamp(col, tz) first"
            )

    priority_pos = None
    fixed_priority = 0
    if isinstance(priority, str):
        col, dtype = _column(df, priority, "priority")
        if not isinstance(dtype, INTEGER_TYPES):
            raise TypeError(f"priority column {priority!r} must hold integers, not "
                            f"{dtype.simpleString()}")
        priority_pos = take(col, priority)
    else:
        fixed_priority = validation.check_priority(priority)

    job_id_pos = None
    if job_id is not None:
        col, dtype = _column(df, job_id, "job_id")
        if not isinstance(dtype, (T.StringType, T.VarcharType, T.CharType, *INTEGER_TYPES)):
            raise TypeError(f"job_id column {job_id!r} must hold text or integers, not "
                            f"{dtype.simpleString()}")
        job_id_pos = take(col.cast("string"), job_id)

    engine = _engine_config() if conf is not None else EngineConfig()
    plan = EnqueuePlan(
        redis_url=redis_url,
        engine=dataclasses.replace(engine, prefix=prefix) if prefix else engine,
        socket_timeout=max(30.0, conf.SOCKET_TIMEOUT if conf is not None else 0.0),
        columns=tuple(names),
        task=task,
        task_pos=task_pos,
        allowed_tasks=allowed,
        queue=queue,
        default_queue=default_queue,
        task_queues=task_queues,
        max_attempts=max_attempts,
        default_max_attempts=conf.MAX_ATTEMPTS if conf is not None else 1,
        task_attempts=task_attempts,
        args=tuple(arg_plan),
        kwargs=tuple(kwarg_plan),
        run_at_kind=run_at_kind,
        run_at_pos=run_at_pos,
        delay=None if delay is None else validation.delay_ms(delay) / 1000,
        priority=fixed_priority,
        priority_pos=priority_pos,
        job_id_pos=job_id_pos,
        job_id_prefix=job_id_prefix,
        chunk_size=chunk_size,
        max_rejected=max_rejected,
    )
    source = df.select(*selected) if selected else df.select(F.lit(None).alias("_c0"))
    parts = source.rdd.mapPartitions(partial(enqueue_partition, plan)).collect()
    summary = EnqueueSummary()
    for part in parts:
        summary.merge(part, max_rejected)
    summary.seconds = time.monotonic() - started
    if summary.rejected > len(summary.rejected_rows):
        log(logger, logging.WARNING, "spark enqueue kept only some rejected rows "
            "(raise max_rejected to see more)", rejected=summary.rejected,
            kept=len(summary.rejected_rows))
    log(logger, logging.INFO, "spark enqueue", task=task or f"column:{task_column}",
        enqueued=summary.enqueued, duplicates=summary.duplicates, rejected=summary.rejected,
        partitions=summary.partitions, seconds=round(summary.seconds, 1))
    return summary
