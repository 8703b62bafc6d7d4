"""The executor side of ``enqueue_dataframe``: one partition's rows become jobs.

:class:`EnqueuePlan` is built on the driver and shipped to the executors (it pickles
small and holds no Django object). :func:`enqueue_partition` validates each row,
derives its job id, and sends the valid ones through ``Broker.enqueue_many`` (one
round trip per chunk). Rows it refuses are counted, and kept up to a limit, with the
reason. It yields exactly one :class:`PartitionResult`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from django_delayq.engine import Broker, EngineConfig, EnqueueRequest, encode_arguments, validation
from django_delayq.engine.errors import PayloadTooLarge
from django_delayq.engine.logfields import log
from django_delayq.engine.urls import client_from_url

from .convert import Rejected, Spec, display, run_at_from_micros, run_at_from_text, to_json_value

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EnqueuePlan:
    """Where each field of a job comes from, as positions in the selected row."""

    redis_url: str = field(repr=False)  # may hold a password: never in a repr
    #: The driver's engine config (from its settings when Django is configured), so an
    #: executor stores, shards and bounds jobs as any producer of the project does.
    engine: EngineConfig = field(default_factory=EngineConfig)
    socket_timeout: float = 30.0
    #: The user's column names of the selected row, for rejected rows.
    columns: tuple[str, ...] = ()
    task: str | None = None
    task_pos: int | None = None
    #: Task names a row may use (None: not checked).
    allowed_tasks: frozenset[str] | None = None
    queue: str | None = None
    default_queue: str = "default"
    task_queues: Mapping[str, str] = field(default_factory=dict)
    max_attempts: int | None = None
    default_max_attempts: int = 1
    task_attempts: Mapping[str, int] = field(default_factory=dict)
    args: tuple[tuple[int, Spec, str], ...] = ()
    kwargs: tuple[tuple[str, int, Spec], ...] = ()
    #: "micros" (a TIMESTAMP column as unix_micros), "text" (ISO 8601 text) or None.
    run_at_kind: str | None = None
    run_at_pos: int | None = None
    delay: float | None = None
    priority: int = 0
    priority_pos: int | None = None
    job_id_pos: int | None = None
    job_id_prefix: str = "spark-"
    chunk_size: int = 1_000
    max_rejected: int = 10_000

    def broker(self) -> Broker:
        """A broker of its own for the executor, on the driver's engine config."""
        return Broker(client_from_url(self.redis_url, decode_responses=True,
                                      socket_timeout=self.socket_timeout,
                                      socket_connect_timeout=min(self.socket_timeout, 10.0)),
                      self.engine)


@dataclass(slots=True)
class PartitionResult:
    """What one partition did: counts, and the first rejected rows with reasons."""

    enqueued: int = 0
    duplicates: int = 0
    rejected: int = 0
    samples: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    queues: dict[str, int] = field(default_factory=dict)


def derive_job_id(prefix: str, task: str, args_json: str, kwargs_json: str, when: str) -> str:
    """A job id that depends only on what the job is, so re-runs find the same id."""
    digest = hashlib.sha256("\x1f".join((task, args_json, kwargs_json, when)).encode())
    return f"{prefix}{digest.hexdigest()[:40]}"


def build_request(plan: EnqueuePlan, row: Any) -> tuple[str, EnqueueRequest]:
    """The queue and the request for ``row``, or :class:`Rejected` saying why not."""
    if plan.task_pos is None:
        task = plan.task or ""
    else:
        task = row[plan.task_pos]
        if task is None:
            raise Rejected("task is null")
    if plan.allowed_tasks is not None and task not in plan.allowed_tasks:
        raise Rejected(f"unknown task {task!r}: no task of that name is registered")
    try:
        task = validation.check_task_name(task)
    except ValueError as exc:
        raise Rejected(str(exc)) from None
    args = [to_json_value(row[pos], spec, f"argument {name!r}") for pos, spec, name in plan.args]
    kwargs = {name: to_json_value(row[pos], spec, f"argument {name!r}")
              for name, pos, spec in plan.kwargs}

    run_at: dt.datetime | None = None
    if plan.run_at_kind == "micros":
        run_at = run_at_from_micros(row[plan.run_at_pos])
    elif plan.run_at_kind == "text":
        run_at = run_at_from_text(row[plan.run_at_pos])
    try:
        if run_at is not None:
            when = str(validation.run_at_ms(run_at))
        else:
            when = "now" if plan.delay is None else f"delay:{validation.delay_ms(plan.delay)}"
    except (TypeError, ValueError) as exc:
        raise Rejected(str(exc)) from None

    priority = plan.priority if plan.priority_pos is None else row[plan.priority_pos]
    if priority is None:
        raise Rejected("priority is null")
    try:
        validation.check_priority(priority)
        validation.check_max_attempts(plan.max_attempts or plan.task_attempts.get(
            task, plan.default_max_attempts))
        args_json, kwargs_json = encode_arguments(task, args, kwargs,
                                                  limit=plan.engine.max_payload_bytes)
    except (TypeError, ValueError, PayloadTooLarge) as exc:
        raise Rejected(str(exc)) from None

    if plan.job_id_pos is None:
        job_id = derive_job_id(plan.job_id_prefix, task, args_json, kwargs_json, when)
    else:
        raw = row[plan.job_id_pos]
        if raw is None:
            raise Rejected("job_id is null")
        try:
            job_id = validation.validate_new_job_id(str(raw))
        except ValueError as exc:
            raise Rejected(str(exc)) from None

    queue = plan.queue or plan.task_queues.get(task, plan.default_queue)
    attempts = plan.max_attempts or plan.task_attempts.get(task, plan.default_max_attempts)
    return queue, EnqueueRequest(
        task=task, args=args, kwargs=kwargs, run_at=run_at,
        delay=None if run_at is not None else plan.delay, priority=priority,
        job_id=job_id, max_attempts=attempts,
    )


def enqueue_partition(plan: EnqueuePlan, rows: Iterable[Any]) -> Iterator[PartitionResult]:
    """Enqueue the valid rows of one partition; yield one :class:`PartitionResult`.

    Connection errors propagate, so Spark retries the task; the retry finds the jobs
    the failed attempt added (same ids) and counts them as duplicates.
    """
    result = PartitionResult()
    broker = plan.broker()
    pending: dict[str, list[EnqueueRequest]] = {}

    def flush(queue: str) -> None:
        requests = pending.pop(queue, [])
        if requests:
            bulk = broker.enqueue_many(queue, requests, chunk_size=len(requests))
            result.enqueued += bulk.enqueued
            result.duplicates += bulk.duplicates
            result.queues[queue] = result.queues.get(queue, 0) + bulk.enqueued

    try:
        for row in rows:
            try:
                queue, request = build_request(plan, row)
            except Rejected as exc:
                result.rejected += 1
                if len(result.samples) < plan.max_rejected:
                    result.samples.append(
                        (str(exc), dict(zip(plan.columns, (display(v) for v in row),
                                            strict=False)))
                    )
                continue
            batch = pending.setdefault(queue, [])
            batch.append(request)
            if len(batch) >= plan.chunk_size:
                flush(queue)
        for queue in list(pending):
            flush(queue)
    finally:
        broker.close()
    log(logger, logging.DEBUG, "spark partition", enqueued=result.enqueued,
        duplicates=result.duplicates, rejected=result.rejected)
    yield result
