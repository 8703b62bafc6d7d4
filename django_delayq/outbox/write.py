"""Writing a job into the outbox in the current transaction, and the commit hook that
sends it at once.

The row is written with the transaction's other changes, so the job exists if and only
if the transaction commits. After the commit, a hook sends the transaction's rows to
Redis in bulk and deletes them, so the job starts within milliseconds as with a direct
enqueue; only when that fails (Redis unreachable, the process killed) do the rows wait
for the relay (:mod:`.relay`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from functools import partial

from django.db import DEFAULT_DB_ALIAS, transaction

from ..conf import conf, django_time
from ..connection import get_broker
from ..engine import EnqueueRequest, Job, JobNotFound, keyed, validation
from ..engine.jobhash import from_ms
from ..engine.logfields import log
from ..engine.status import OUTBOX
from ..models import OutboxEntry
from .send import relax_commit, send_rows, settle, take

logger = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class OutboxJob(Job):
    """A job written to the outbox. Its status is ``"outbox"`` until it reaches Redis.

    ``refresh()`` reads Redis; while the job is not there yet but its row is, the status
    stays ``"outbox"`` (``JobNotFound`` once neither holds it: its transaction rolled
    back, or the row was deleted).
    """

    database: str = DEFAULT_DB_ALIAS

    def refresh(self) -> Job:
        try:
            return super().refresh()
        except JobNotFound:
            waiting = OutboxEntry.objects.using(self.database).filter(
                job_id=self.id, queue=self.queue)
            if not waiting.exists():
                raise
            self.status = OUTBOX
            return self


def write(queue: str, request: EnqueueRequest, arg_names: Sequence[str],
          using: str | None) -> OutboxJob:
    """Insert the job of ``request`` (its arguments checked against the task's function,
    whose positional parameters are ``arg_names``) in the outbox of database ``using``
    (see :meth:`Task.enqueue_in_transaction`)."""
    alias = using or DEFAULT_DB_ALIAS
    queue = validation.validate_queue_name(queue)
    broker = get_broker()  # no connection is made: only its checks and encoder are used
    # A keyed job's id lands in its key's shard, as a direct enqueue's does.
    job = broker.encode_request(request, arg_names, shards=broker.shard_count(queue)
                                if request.keyed is not None else 1)
    due = from_ms(job.run_at_ms)
    stored = django_time(due)
    row = OutboxEntry.objects.using(alias).create(
        job_id=job.job_id, queue=queue, task_name=request.task, args=job.args_json,
        kwargs=job.kwargs_json, priority=request.priority, run_at=stored,
        max_attempts=request.max_attempts,
        timeout=job.timeout_ms / 1000 if isinstance(job.timeout_ms, int) else None,
        keyed=keyed.to_text(request.keyed))
    if conf.OUTBOX["FAST_PATH"]:
        _pending_ids(alias).append(row.pk)
        # One hook per row: Django drops the hooks of a rolled-back savepoint with its
        # rows. The first hook that runs sends every row of the transaction; the others
        # find nothing left to do.
        transaction.on_commit(partial(flush, alias), using=alias)
    return OutboxJob(
        id=job.job_id, queue=queue, task_name=request.task, status=OUTBOX,
        args=list(request.args), kwargs=dict(request.kwargs), priority=request.priority,
        run_at=due, max_attempts=request.max_attempts, database=alias, outcome=OUTBOX,
        concurrency_key=request.keyed.concurrency_key or None if request.keyed else None,
    )


_local = threading.local()


def _pending_ids(alias: str) -> list[int]:
    """Ids of rows this thread wrote on ``alias`` that no commit hook has sent yet."""
    pending: dict[str, list[int]] | None = getattr(_local, "pending", None)
    if pending is None:
        pending = _local.pending = {}
    return pending.setdefault(alias, [])


def flush(alias: str) -> None:
    """The commit hook: send the rows this thread wrote on ``alias``, delete them.

    The rows are read back (and locked, as the relay does: a relay never sends them at
    the same time): those of a rolled-back transaction or savepoint are not there. Any
    failure leaves the rows for the relay; nothing is raised to the code that committed
    (its transaction is already committed, and the jobs are safe).
    """
    pending = _pending_ids(alias)
    if not pending:
        return
    ids, pending[:] = list(pending), []
    size = conf.OUTBOX["CHUNK_SIZE"]
    try:
        broker = get_broker()
        for start in range(0, len(ids), size):
            with transaction.atomic(using=alias):
                relax_commit(alias)  # lost in a crash, the rows are sent again: one job each
                mine = OutboxEntry.objects.using(alias).filter(
                    pk__in=ids[start:start + size], parked_at__isnull=True)
                rows = take(alias, mine, size)
                if not rows:
                    continue
                outcome = send_rows(broker, rows)
                settle(alias, outcome)
            if outcome.failure is not None:
                log(logger, logging.WARNING, "outbox: Redis is unreachable at commit, the "
                    "relay will send the rows", count=len(ids) - start, error=outcome.failure)
                return
    except Exception as exc:  # the rows are safe: the relay sends them
        log(logger, logging.WARNING, "outbox: sending at commit failed, the relay will send "
            "the rows", error=f"{type(exc).__name__}: {exc}")

