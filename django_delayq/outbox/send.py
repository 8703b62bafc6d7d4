"""Sending outbox rows to Redis, and settling the rows once Redis answered.

One place decides what a failure means: Redis unreachable (or unable to write for now: a
failover, a full memory, a replica missing) is *transient*, and the rows stay, tried
again until Redis takes them, however long that takes; anything else Redis or the checks
refuse (an unknown task, arguments that are no longer valid) is a *refusal*, and the row
is parked at once with its error instead of being retried for ever. Rows are sent with
the engine's bulk enqueue and their job ids, so a row sent twice is one job.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Collection, Sequence

from django.db import connections, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from ..conf import aware_time
from ..engine import (
    Broker,
    EnqueueRequest,
    UnknownTask,
    keyed,
    validation,
)
from ..engine.failover import REFUSED, is_transient
from ..engine.logfields import log
from ..models import OutboxEntry

logger = logging.getLogger(__name__)

MAX_ERROR_CHARS = 2_000


def describe(exc: BaseException) -> str:
    """The error as kept on a row: its class and message (never a traceback)."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]


def request_of(row: OutboxEntry) -> EnqueueRequest:
    """The enqueue request a row stands for. Raises ``ValueError`` for a damaged row."""
    validation.validate_queue_name(row.queue)
    try:
        args, kwargs = json.loads(row.args), json.loads(row.kwargs)
    except ValueError as exc:
        raise ValueError(f"the stored arguments are not JSON: {exc}") from None
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise ValueError("the stored arguments are not a JSON list and a JSON object")
    try:
        options = keyed.from_text(row.keyed)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the stored flow-control keys are damaged: {exc}") from None
    run_at, delay = row.run_at, keyed.debounce_delay(options)
    # a debounce window runs from when the job reaches Redis; with USE_TZ = False the
    # row's time is a local one
    run_at = None if delay is not None else aware_time(run_at)
    return EnqueueRequest(task=row.task_name, args=args, kwargs=kwargs, run_at=run_at,
                          delay=delay, priority=row.priority, job_id=row.job_id,
                          max_attempts=row.max_attempts, timeout=row.timeout, keyed=options)


@dataclasses.dataclass
class Outcome:
    """What became of a batch of rows."""

    sent: list[int] = dataclasses.field(default_factory=list)  # row ids Redis has
    refused: dict[int, str] = dataclasses.field(default_factory=dict)  # row id -> error
    #: The transient error that stopped the sending (the rows not sent or refused stay).
    failure: BaseException | None = None
    added: int = 0  # new jobs
    duplicates: int = 0  # rows whose job was already in Redis (sent before)


def send_rows(broker: Broker, rows: Sequence[OutboxEntry],
              known_tasks: Collection[str] | None = None) -> Outcome:
    """Send ``rows`` to Redis, one bulk call per queue; stop at the first transient error.

    ``known_tasks``: the task names this process can vouch for (the task registry); a
    row naming another one is refused (its task was renamed or removed by a deploy).
    ``None``, or an empty registry (a process that knows no task cannot tell a removed
    one), checks nothing.
    """
    if known_tasks is not None and not len(known_tasks):
        known_tasks = None
    outcome = Outcome()
    by_queue: dict[str, list[tuple[OutboxEntry, EnqueueRequest]]] = {}
    for row in rows:
        try:
            if known_tasks is not None and row.task_name not in known_tasks:
                raise UnknownTask(f"no task named {row.task_name!r} is registered: was it "
                                  "renamed or removed since the row was written?")
            request = request_of(row)
        except (UnknownTask, TypeError, ValueError) as exc:
            outcome.refused[row.pk] = describe(exc)
            continue
        by_queue.setdefault(row.queue, []).append((row, request))
    for queue, items in by_queue.items():
        try:
            _send_queue(broker, queue, items, outcome)
        except Exception as exc:
            if not is_transient(exc):
                raise
            outcome.failure = exc
            break
    return outcome


def _send_queue(broker: Broker, queue: str, items: list[tuple[OutboxEntry, EnqueueRequest]],
                outcome: Outcome) -> None:
    """Send one queue's rows in one call; if it is refused, row by row to find the culprit."""
    try:
        result = broker.enqueue_many(queue, [request for _, request in items],
                                     chunk_size=len(items))
    except Exception as exc:
        if is_transient(exc) or not isinstance(exc, (TypeError, ValueError, *REFUSED)):
            raise
        if len(items) == 1:
            outcome.refused[items[0][0].pk] = describe(exc)
            return
        for item in items:
            _send_queue(broker, queue, [item], outcome)
        return
    outcome.sent += [row.pk for row, _ in items]
    outcome.added += result.enqueued
    outcome.duplicates += result.duplicates


def take(using: str, waiting: QuerySet[OutboxEntry], limit: int) -> list[OutboxEntry]:
    """Lock and read up to ``limit`` rows of ``waiting``, oldest first, in the current
    transaction (which then commits without waiting for the WAL flush: see
    :func:`relax_commit`).

    Rows another transaction holds are skipped (``FOR UPDATE SKIP LOCKED``), so two
    senders never send the same row. SQLite has no row locks: a write first takes the
    database's write lock, so senders take turns (the next one waits for the commit).
    """
    connection = connections[using]
    relax_commit(using)
    if connection.vendor == "sqlite":
        OutboxEntry.objects.using(using).filter(pk=0).update(attempts=0)
    waiting = waiting.order_by("pk")
    if connection.features.has_select_for_update:
        waiting = waiting.select_for_update(
            skip_locked=connection.features.has_select_for_update_skip_locked)
    return list(waiting[:limit])


def relax_commit(using: str) -> None:
    """Let the current transaction commit without waiting for its WAL flush (PostgreSQL).

    Settling only deletes rows Redis already has and updates bookkeeping: if a crash
    loses it, the rows are sent again, and their job ids make that one job each. Not
    waiting for the disk saves a flush per commit hook and per relay round.
    """
    connection = connections[using]
    if connection.vendor == "postgresql" and connection.in_atomic_block:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


def settle(using: str, outcome: Outcome, tried: Sequence[int] = ()) -> int:
    """Delete the rows Redis has, park the refused ones, and note a transient failure
    on the rows of ``tried`` that were neither (they stay waiting, never parked for it).

    Returns how many rows were parked. Runs in a transaction of its own unless one is
    open.
    """
    outermost = not connections[using].in_atomic_block
    with transaction.atomic(using=using, savepoint=False):
        if outermost:
            relax_commit(using)
        return _settle(using, outcome, tried)


def _settle(using: str, outcome: Outcome, tried: Sequence[int]) -> int:
    rows = OutboxEntry.objects.using(using)
    if outcome.sent:
        rows.filter(pk__in=outcome.sent).delete()
    now = timezone.now()
    for pk, error in outcome.refused.items():
        rows.filter(pk=pk).update(parked_at=now, error=error)
    done = set(outcome.sent) | set(outcome.refused)
    waiting = [pk for pk in tried if pk not in done]
    if outcome.failure is not None and waiting:
        # Shown in the admin: how often, and why, the rows could not be sent yet.
        rows.filter(pk__in=waiting).update(attempts=F("attempts") + 1,
                                           error=describe(outcome.failure))
    if outcome.refused:
        log(logger, logging.ERROR, "outbox parked rows Redis refused",
            count=len(outcome.refused), first_error=next(iter(outcome.refused.values())))

    return len(outcome.refused)
