"""The model mirror: the stream consumer's sink that keeps :class:`django_delayq.models.Job`
rows in step with the events streams (:class:`~django_delayq.runtime.consumer.StreamConsumer`
reads them, in batches, through the group :data:`GROUP`).

A batch is acknowledged only after the database transaction holding its rows commits:
a crash or a database outage loses nothing, the batch is written again. Writes are
idempotent: a row remembers the stream position its state is as of, an event it already
holds is not written again, and a write of an older position never replaces a newer one
(:mod:`.table`).

Redis stays the source of truth: a row is built from the job HASH read at mirror time
(its newest state), or from the events alone when the hash is gone (result TTL, purge).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Iterable
from functools import partial

from django.db import DatabaseError, DataError, IntegrityError, connections, transaction
from django.utils import timezone

from ..conf import conf
from ..connection import get_broker
from ..engine import Broker, DelayQError
from ..engine.fields import stored
from ..engine.keys import QueueKeys
from ..engine.logfields import log
from ..engine.status import FINISHED, UNFINISHED
from ..engine.streams import StreamBatch
from ..engine.workers import consumers_gone
from ..models import Job
from ..runtime.consumer import Event, StreamConsumer, entries_of, logger, parse_entry, stream_id
from . import table
from .events import apply_event, row_from_hash
from .table import NO_POSITION

#: The consumer group every mirror reads through.
GROUP = "delayq-mirror"
#: Seconds between two reconciliations with Redis (:meth:`Mirror.reconcile`), how long
#: a row must have gone without an event to be checked, and rows checked per round: a
#: row is put right within about a minute and a half of its job's last event.
RECONCILE_INTERVAL = 30.0
RECONCILE_AFTER = 60.0
RECONCILE_CHUNK = 2_000
#: Errors of the database that one job's row can cause (a value out of a column's
#: range, a constraint): they skip that job alone. Any other error of the database
#: (away, read-only after a failover, a column missing before ``migrate``) or of Redis
#: stops the batch, to be written again later: skipping it would lose every event.
ROW_ERRORS = (DataError, IntegrityError)


def stalls(exc: Exception) -> bool:
    """Whether ``exc`` stops the batch rather than skipping the job that raised it."""
    return isinstance(exc, DelayQError) or (
        isinstance(exc, DatabaseError) and not isinstance(exc, ROW_ERRORS))


class Mirror(StreamConsumer):
    """Keeps Job rows in step with the events streams of every queue (or of ``queues``).

    ``run()`` loops until stopped; ``run(burst=True)`` mirrors what the streams hold and
    returns. Settings left as None read ``MIRROR_BATCH_SIZE`` and ``MIRROR_CLAIM_IDLE``.
    """

    group = GROUP
    reader = "mirror"
    stalls = (DatabaseError,)
    writes_to = "the database"

    def __init__(self, *, broker: Broker | None = None, name: str | None = None,
                 batch_size: int | None = None, block: float = 1.0,
                 claim_idle: float | None = None, queues: Iterable[str] | None = None,
                 refresh_interval: float = 10.0, prune_interval: float = 300.0,
                 reconcile_interval: float = RECONCILE_INTERVAL) -> None:
        table.check_database()
        broker = broker or get_broker(socket_timeout=block + conf.SOCKET_TIMEOUT)
        super().__init__(broker, name=name, batch_size=batch_size or conf.MIRROR_BATCH_SIZE,
                         block=block, claim_idle=conf.MIRROR_CLAIM_IDLE
                         if claim_idle is None else claim_idle,
                         queues=list(queues) if queues else None,
                         refresh_interval=refresh_interval,
                         consumers_gone=partial(consumers_gone, broker))
        self.prune_interval = prune_interval
        self.reconcile_interval = reconcile_interval
        self._reconciled_at = 0.0
        self._pruned_at = 0.0
        #: The primary key the last reconciliation ended at (0: start from the first row).
        self._reconciled_past = 0

    @property
    def mirrored(self) -> int:
        """Events applied (rows written or found newer)."""
        return self.entries

    # -- the sink -------------------------------------------------------------------

    def write(self, keys: QueueKeys, batch: StreamBatch, *, recovered: bool) -> None:
        self.apply(keys, entries_of(batch))

    def recover(self) -> None:
        db = connections[table.alias()]  # the one the rows go to, as the routers say
        if not db.in_atomic_block:
            db.close()  # drop a possibly broken connection; reconnect next round

    def maintain(self) -> None:
        now = time.monotonic()
        if now - self._pruned_at >= self.prune_interval:
            self._pruned_at = now
            self.prune()
        if now - self._reconciled_at >= self.reconcile_interval:
            self._reconciled_at = now
            self.reconcile()

    def reconcile(self, *, quiet_for: float = RECONCILE_AFTER) -> int:
        """Put right the rows of unfinished jobs that no event changed for ``quiet_for``
        seconds (a job's last events may still be on their way), :data:`RECONCILE_CHUNK`
        at a time, against their jobs in Redis:

        - a job Redis no longer holds (lost in a failover, its keys deleted by hand): its
          row is marked (``missing_at``); a later event of the job clears the mark;
        - a job Redis holds as finished: its row is rewritten from the hash. A failover
          that drops the old primary's last writes can leave a row as of a position of
          that dropped history, later than the job's own last events on the new
          primary, which then seemed older than the row and were not written.

        Each round goes on from the row the last one ended at (in primary key order),
        and starts over past the last row: every quiet row is checked in turn, however
        many wait (a backlog of jobs due tomorrow is quiet, unfinished and right).

        Returns how many rows were marked or rewritten."""
        now = timezone.now()
        quiet = now - dt.timedelta(seconds=quiet_for)
        candidates = Job.objects.filter(status__in=UNFINISHED, missing_at__isnull=True,
                                        updated_at__lt=quiet, pk__gt=self._reconciled_past)
        if self.fixed_queues:
            candidates = candidates.filter(queue__in=self.fixed_queues)
        chunk = list(candidates.order_by("pk").values_list("pk", "queue", "job_id")[
            :RECONCILE_CHUNK])
        shards: dict[QueueKeys, list[str]] = {}
        for _, queue, job_id in chunk:
            shards.setdefault(self.broker.keys_for(queue, job_id), []).append(job_id)
        marked = rewritten = 0
        for keys, job_ids in shards.items():
            with self.broker.read_errors():
                position, hashes = self.broker.commands.read_jobs(keys, job_ids)
            read_at = stream_id(position) if position else NO_POSITION
            # Rows written meanwhile are left alone: their job may be back, or its
            # events were written after all.
            still_quiet = Job.objects.filter(queue=keys.queue, updated_at__lt=quiet)
            gone, finished = [], []
            for job_id, data in zip(job_ids, hashes, strict=True):
                if not data:
                    gone.append(job_id)
                elif isinstance(data, dict) and data.get(stored("status")) in FINISHED:
                    row = row_from_hash(keys.queue, job_id, data)
                    row.update(table.position_fields(read_at, now))
                    finished.append(row)
            if gone:
                marked += still_quiet.filter(job_id__in=gone).update(missing_at=now)
            # Replaced, not upserted: the upsert keeps the row's later position.
            for row in finished:
                with transaction.atomic(using=table.alias()):
                    if still_quiet.filter(job_id=row["job_id"]).delete()[0]:
                        table.upsert([row])
                        rewritten += 1
        # Past this chunk only once it was read: a round that failed is done again.
        self._reconciled_past = chunk[-1][0] if len(chunk) == RECONCILE_CHUNK else 0
        if marked:
            log(logger, logging.WARNING, "mirror marked rows of jobs gone from Redis",
                count=marked)
        if rewritten:
            log(logger, logging.WARNING, "mirror rewrote rows of finished jobs from Redis",
                count=rewritten)
        return marked + rewritten

    def apply(self, keys: QueueKeys, entries: list[tuple[str, dict[str, str]]]) -> None:
        """Write the rows of ``entries`` (not acknowledged here).

        An entry that cannot be applied (garbled, or a job whose row cannot be built or
        written) is skipped: logged, recorded for operators (:meth:`skip`), so it never
        holds back the stream. Only errors of Redis or a database that is away stop the
        batch, to be written again later.
        """
        by_job: dict[str, list[Event]] = {}
        for entry_id, fields in entries:
            events = parse_entry(keys, entry_id, fields, partial(self.skip, keys, entry_id))
            for event in events:
                by_job.setdefault(event.job_id, []).append(event)
        for events in by_job.values():
            events.sort(key=lambda e: e.order)
        # Bulk enqueues name up to 1,000 jobs per entry: write batch_size jobs per
        # transaction (each write is idempotent, so a crash before the ack is harmless).
        jobs = list(by_job.items())
        for start in range(0, len(jobs), self.batch_size):
            part = dict(jobs[start:start + self.batch_size])
            try:
                self._write(keys, part)
            except Exception as exc:
                if stalls(exc):
                    raise  # Redis or the database cannot take it now: the whole batch later
                log(logger, logging.WARNING, "mirror batch refused, writing job by job",
                    stream=keys.events, error=exc)
                self._write_one_by_one(keys, part)

    def _write_one_by_one(self, keys: QueueKeys, by_job: dict[str, list[Event]]) -> None:
        """Write each job alone; a job whose row cannot be written is skipped.

        One bad value (say, a NaN in a job's arguments, a number too large for its
        column, a time out of range) must not hold back every other event of the stream.
        """
        for job_id, events in by_job.items():
            try:
                self._write(keys, {job_id: events})
            except Exception as exc:
                if stalls(exc):
                    raise
                self.skip(keys, ",".join(e.entry_id for e in events),
                          f"job {job_id}: {type(exc).__name__}: {exc}", events=len(events))

    def _write(self, keys: QueueKeys, by_job: dict[str, list[Event]]) -> None:
        """Write the row of each job of ``by_job`` (its events, oldest first) that is
        older than its newest event, in one transaction.

        A row takes its job HASH's state, as of the stream position read with it; when
        the hash is gone, the events newer than the row, applied in order.
        """
        queue = keys.queue
        # Read before the transaction, so that on SQLite its first statement is a write
        # (which takes the database's write lock at once).
        stored = table.positions(queue, by_job)
        todo = [job_id for job_id, events in by_job.items()
                if events[-1].order > stored.get(job_id, NO_POSITION)]
        if not todo:
            return
        with self.broker.read_errors():  # a Redis error is no fault of these jobs
            position, hashes = self.broker.commands.read_jobs(keys, todo)
        read_at = stream_id(position) if position else NO_POSITION
        now = timezone.now()
        rows = []
        gone: dict[str, list[Event]] = {}
        for job_id, data in zip(todo, hashes, strict=True):
            events = by_job[job_id]
            if isinstance(data, str):
                raise ValueError(f"its key holds a {data}, not a job hash")
            if data:
                row = row_from_hash(queue, job_id, data)
                row.update(table.position_fields(max(read_at, events[-1].order), now))
                rows.append(row)
            else:
                gone[job_id] = events
        with transaction.atomic(using=table.alias()):
            if gone:
                rows += _rows_from_events(queue, gone, now)
            table.upsert(rows)

    def prune(self) -> int:
        """Delete finished rows older than ``MIRROR_RETENTION``, and those of jobs found
        gone from Redis longer ago. Returns how many."""
        retention = conf.MIRROR_RETENTION
        if retention is None:
            return 0
        cutoff = timezone.now() - dt.timedelta(seconds=retention)
        deleted = sum(table.prune(older_than=cutoff).values())
        if deleted:
            log(logger, logging.INFO, "mirror pruned finished rows", count=deleted,
                older_than=cutoff.isoformat())

        return deleted

def _rows_from_events(queue: str, by_job: dict[str, list[Event]],
                      now: dt.datetime) -> list[table.Row]:
    """The rows of jobs whose hash is gone: each stored row (locked, so that no other
    writer changes it meanwhile) with the events newer than it applied in order."""
    rows = []
    for job_id, row in table.lock_rows(queue, by_job, now).items():
        newer = [event for event in by_job[job_id]
                 if event.order > (row["last_event_ms"], row["last_event_seq"])]
        if not newer:
            continue  # another writer got there first
        for event in newer:
            apply_event(row, event)
        row.update(table.position_fields(newer[-1].order, now))
        rows.append(row)
    return rows


def refresh_rows(queue: str, job_ids: Iterable[str], *, broker: Broker | None = None) -> int:
    """Rewrite the rows of ``job_ids`` from their job hashes now, without waiting for
    their events (an admin action shows its effect at once). Returns how many.

    Each row takes the stream position read with its hash, as the mirror's writes do:
    whichever of the two writes a job last, its row ends in the newer state, and the
    events up to that position are not written again. A job whose hash is gone is left
    to its events.
    """
    broker = broker or get_broker()
    shards: dict[QueueKeys, list[str]] = {}
    for job_id in job_ids:
        shards.setdefault(broker.keys_for(queue, job_id), []).append(job_id)
    now = timezone.now()
    rows = []
    with broker.connection_errors():
        for keys, ids in shards.items():
            position, hashes = broker.commands.read_jobs(keys, ids)
            if not position:
                continue  # no events: nothing to order a write against
            read_at = stream_id(position)
            for job_id, data in zip(ids, hashes, strict=True):
                if data and isinstance(data, dict):
                    row = row_from_hash(queue, job_id, data)
                    row.update(table.position_fields(read_at, now))
                    rows.append(row)
    with transaction.atomic(using=table.alias()):
        table.upsert(rows)
    return len(rows)


def table_exists() -> bool:
    try:
        return Job._meta.db_table in connections[table.alias()].introspection.table_names()
    except DatabaseError:
        return True  # the database is down: the mirror's own backoff handles it
