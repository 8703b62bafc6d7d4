"""The model mirror: each queue shard's events stream -> :class:`django_delayq.models.Job`.

Reads go through one consumer group per stream (:data:`GROUP`), so any number of
mirrors (one per worker process, or ``manage.py delayq_mirror``) share the work. An
entry is acknowledged only after the database transaction holding its row commits: a
crash or a database outage loses nothing, the entries stay pending and are read again
(the consumer's own pending entries first, then other consumers' entries idle for longer
than ``claim_idle``). Writes are idempotent: a row remembers the stream position its
state is as of, an event it already holds is not written again, and a write of an older
position never replaces a newer one (:mod:`.table`).

Redis stays the source of truth: a row is built from the job HASH read at mirror time
(its newest state), or from the events alone when the hash is gone (result TTL, purge).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from functools import partial
from typing import Any

from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    connection,
    transaction,
)
from django.db.models import Q
from django.utils import timezone
from redis.cluster import RedisCluster
from redis.exceptions import RedisError

from ..conf import conf
from ..connection import get_broker
from ..engine import Broker, streams
from ..engine.backoff import Backoff
from ..engine.errors import DelayQConnectionError
from ..engine.keys import QueueKeys
from ..engine.status import FINISHED_IN_HISTORY
from ..models import Job
from . import table
from .events import Event, apply_event, parse_entry, row_from_hash, stream_id
from .table import NO_POSITION
from .takeover import GROUP, claim_from_gone

logger = logging.getLogger(__name__)

#: Errors that stop a batch to be read again later (nothing is skipped for them): Redis
#: or the database is away. Any other error of one event skips that event alone.
STALLS = (OperationalError, InterfaceError, RedisError, DelayQConnectionError)
#: Seconds between two looks for consumers that are gone (their pending entries are
#: taken over at once).
GONE_CHECK_EVERY = 2.0


class Mirror:
    """Keeps Job rows in step with the events streams of every queue.

    ``run()`` loops until :meth:`request_stop`; ``run(burst=True)`` mirrors what the
    streams hold and returns. Errors of Redis or of the database are logged and retried
    with a capped backoff; nothing is acknowledged until it is written.
    """

    def __init__(self, *, broker: Broker | None = None, name: str | None = None,
                 batch_size: int | None = None, block: float = 1.0,
                 claim_idle: float | None = None, queues: Iterable[str] | None = None,
                 refresh_interval: float = 10.0, prune_interval: float = 300.0) -> None:
        table.check_database()
        self.broker = broker or get_broker(socket_timeout=block + conf.SOCKET_TIMEOUT)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.batch_size = batch_size or conf.MIRROR_BATCH_SIZE
        self.block_ms = max(1, int(block * 1000))
        self.claim_idle_ms = int((conf.MIRROR_CLAIM_IDLE if claim_idle is None
                                  else claim_idle) * 1000)
        self.fixed_queues = list(queues) if queues else None
        self.refresh_interval = refresh_interval
        self.prune_interval = prune_interval
        self.mirrored = 0  # events applied (rows written or found newer)
        self.skipped = 0  # garbled entries acknowledged without a write
        self._stop = threading.Event()
        self._shards: list[QueueKeys] = []
        self._ready: set[str] = set()  # streams whose group exists
        self._recovered: set[str] = set()  # streams whose own PEL was read once
        self._refreshed_at = 0.0
        self._pruned_at = 0.0
        self._claim_due = 0.0
        self._gone_due = 0.0  # when to look for consumers that are gone next
        self._claim_every = min(max(self.claim_idle_ms / 2000, 1.0), 30.0)
        # A cluster cannot read streams of several slots in one command.
        self._one_command_per_stream = isinstance(self.broker.client, RedisCluster)

    # -- control -------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def drain(self, timeout: float | None = None) -> int:
        """Mirror what the streams hold now, even after :meth:`request_stop`, and return
        the number of events applied (at most ``timeout`` seconds)."""
        self._stop.clear()
        return self.run(burst=True, timeout=timeout)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, *, burst: bool = False, timeout: float | None = None) -> int:
        """Mirror until stopped (or, with ``burst``, until the streams are drained).

        ``timeout`` bounds the run in seconds. Returns the number of events applied.
        """
        logger.info("mirror started consumer=%s group=%s burst=%s", self.name, GROUP, burst)
        backoff = Backoff(self._stop, first=0.5, cap=30.0)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() > deadline:
                break
            try:
                done = self.step(block=not burst)
                backoff.reset()
                if burst and done == 0:
                    break
            except (RedisError, DelayQConnectionError) as exc:
                logger.warning("mirror cannot reach Redis, retrying in %.1fs error=%s",
                               backoff.delay, exc)
                self._ready.clear()
                self._recovered.clear()
                backoff.wait()
            except DatabaseError as exc:
                logger.warning("mirror cannot write to the database, retrying in %.1fs "
                               "error=%s", backoff.delay, exc)
                # The failed batch is pending on this consumer: read it again next round,
                # not only once another consumer's claim_idle has run out.
                self._recovered.clear()
                if not connection.in_atomic_block:
                    connection.close()  # drop a possibly broken connection; reconnect next round
                backoff.wait()
            except Exception:
                logger.exception("mirror round failed, retrying in %.1fs", backoff.delay)
                self._recovered.clear()
                backoff.wait()
        logger.info("mirror stopped consumer=%s mirrored=%d", self.name, self.mirrored)
        return self.mirrored

    # -- one round -----------------------------------------------------------------

    def step(self, *, block: bool = False) -> int:
        """Read and apply one batch per stream. Returns how many entries it handled.

        Order: this consumer's own pending entries (until none are left), then other
        consumers' entries idle for ``claim_idle`` (checked now and then), then new ones,
        blocking up to ``block`` seconds for them when nothing else was found.
        """
        self._refresh_shards()
        self._maybe_prune()
        handled = 0
        for keys in self._shards:
            if keys.events not in self._recovered:
                got = self._entries(self._read({keys.events: "0"}))
                if got:
                    handled += self._apply(keys, got)
                else:
                    self._recovered.add(keys.events)
        if time.monotonic() >= self._gone_due:
            handled += sum(self._take_over_gone(keys) for keys in self._shards)
            self._gone_due = time.monotonic() + GONE_CHECK_EVERY
        if self.claim_idle_ms >= 0 and time.monotonic() >= self._claim_due:
            taken = sum(self._take_over(keys) for keys in self._shards)
            handled += taken
            # Come back at once while there is more to take, else in a while.
            self._claim_due = 0.0 if taken else time.monotonic() + self._claim_every
        if handled:
            return handled
        if not self._shards:
            if block:
                self._stop.wait(self.block_ms / 1000)
            return 0
        wait = self.block_ms if block else None
        if self._one_command_per_stream:
            for keys in self._shards:
                handled += self._read_new({keys.events: ">"}, None)
            if not handled and block:
                self._stop.wait(self.block_ms / 1000)
            return handled
        return self._read_new({keys.events: ">" for keys in self._shards}, wait)

    def _read_new(self, wanted: dict[str, str], block: int | None) -> int:
        by_stream = {keys.events: keys for keys in self._shards}
        handled = 0
        for stream, got in self._read(wanted, block=block):
            if got:
                handled += self._apply(by_stream[stream], got)
        return handled

    @staticmethod
    def _entries(reply: list[Any]) -> list[tuple[str, dict[str, str] | None]]:
        return [entry for _, got in reply for entry in got]

    def _take_over(self, keys: QueueKeys) -> int:
        """Claim and apply one batch of another consumer's long-pending entries."""
        entries, _ = streams.take_over_idle(self.broker.client, keys.events, GROUP, self.name,
                                            self.claim_idle_ms, self.batch_size)
        if not entries:
            return 0
        logger.info("mirror took over pending events stream=%s count=%d", keys.events,
                    len(entries))
        return self._apply(keys, entries)

    def _take_over_gone(self, keys: QueueKeys) -> int:
        """Apply every pending entry of consumers that are gone (see :mod:`.takeover`)."""
        return sum(self._apply(keys, batch) if batch else 0
                   for batch in claim_from_gone(self.broker, keys, self.name, self.batch_size))

    def _refresh_shards(self) -> None:
        now = time.monotonic()
        if self._shards and now - self._refreshed_at < self.refresh_interval:
            return
        self._shards = streams.shards_to_read(self.broker, self.fixed_queues)
        self._refreshed_at = now
        for keys in self._shards:
            self._ensure_group(keys)

    def _ensure_group(self, keys: QueueKeys) -> None:
        if keys.events in self._ready:
            return
        streams.ensure_group(self.broker.client, keys.events, GROUP)
        self._ready.add(keys.events)

    def _read(self, wanted: dict[str, str], block: int | None = None) -> list[Any]:
        try:
            return streams.read(self.broker.client, GROUP, self.name, wanted,
                                self.batch_size, block)
        except streams.GroupGone:
            # A stream or its group was deleted (FLUSHDB, a Redis without persistence
            # restarted): create the groups again on the next round.
            self._ready.clear()
            self._refreshed_at = 0.0
            return []

    # -- writing -------------------------------------------------------------------

    def _apply(self, keys: QueueKeys, entries: list[tuple[str, dict[str, str] | None]]) -> int:
        """Write a batch, then acknowledge it. Returns the number of entries.

        An entry that cannot be applied (garbled, or a job whose row cannot be built or
        written) is skipped: logged, recorded for operators (:meth:`_record_skip`) and
        acknowledged with the rest, so it never holds back the stream. Only errors of
        Redis or a database that is away stop the batch, to be read again later.
        """
        ids = [entry_id for entry_id, _ in entries]
        by_job: dict[str, list[Event]] = {}
        for entry_id, fields in entries:
            events = parse_entry(keys, entry_id, fields,
                                 partial(self._record_skip, keys, entry_id))
            if not events:
                self.skipped += 1
            for event in events:
                by_job.setdefault(event.job_id, []).append(event)
        logger.debug("mirror read batch stream=%s entries=%d jobs=%d", keys.events,
                     len(entries), len(by_job))
        for events in by_job.values():
            events.sort(key=lambda e: e.order)
        # Bulk enqueues name up to 1,000 jobs per entry: write batch_size jobs per
        # transaction (each write is idempotent, so a crash before the ack is harmless).
        jobs = list(by_job.items())
        for start in range(0, len(jobs), self.batch_size):
            part = dict(jobs[start:start + self.batch_size])
            try:
                self._write(keys, part)
            except STALLS:
                raise  # Redis or the database is away: retry the whole batch later
            except Exception as exc:
                logger.warning("mirror batch refused, writing job by job stream=%s error=%s",
                               keys.events, exc)
                self._write_one_by_one(keys, part)
        self._acknowledge(keys, ids)
        self.mirrored += len(entries)
        return len(entries)

    def _acknowledge(self, keys: QueueKeys, ids: list[str]) -> None:
        """Acknowledge entries whose rows are committed (what a crash may fall between)."""
        streams.ack(self.broker.client, keys.events, GROUP, ids)

    def _write_one_by_one(self, keys: QueueKeys, by_job: dict[str, list[Event]]) -> None:
        """Write each job alone; a job whose row cannot be written is skipped.

        One bad value (say, a NaN in a job's arguments, a number too large for its
        column, a time out of range) must not hold back every other event of the stream.
        """
        for job_id, events in by_job.items():
            try:
                self._write(keys, {job_id: events})
            except STALLS:
                raise
            except Exception as exc:
                self.skipped += len(events)
                self._record_skip(keys, ",".join(e.entry_id for e in events),
                                  f"job {job_id}: {type(exc).__name__}: {exc}")

    def _record_skip(self, keys: QueueKeys, entry_id: str, reason: str) -> None:
        """Log a skipped event and keep it where operators see it (a count and the newest
        reasons per queue shard: ``Queue.skipped_events()``, the dashboard, the API)."""
        reason = streams.record_skip(self.broker.client, keys, "mirror", entry_id, reason)
        logger.error("mirror skipped an event it cannot apply stream=%s id=%s reason=%s",
                     keys.events, entry_id, reason)

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

    # -- retention -----------------------------------------------------------------

    def _maybe_prune(self) -> None:
        now = time.monotonic()
        if now - self._pruned_at < self.prune_interval:
            return
        self._pruned_at = now
        self.prune()
        self._forget_dead_consumers()

    def prune(self) -> int:
        """Delete finished rows older than ``MIRROR_RETENTION``. Returns how many."""
        retention = conf.MIRROR_RETENTION
        if retention is None:
            return 0
        cutoff = timezone.now() - dt.timedelta(seconds=retention)
        old = Job.objects.filter(status__in=FINISHED_IN_HISTORY).filter(
            Q(finished_at__lt=cutoff) | Q(finished_at__isnull=True, updated_at__lt=cutoff))
        deleted, _ = old.delete()
        if deleted:
            logger.info("mirror pruned finished rows count=%d older_than=%s", deleted, cutoff)
        return deleted

    def _forget_dead_consumers(self) -> None:
        """Remove consumers of the group with nothing pending, idle for an hour."""
        for keys in self._shards:
            for consumer in self.broker.client.xinfo_consumers(keys.events, GROUP):
                if (consumer["name"] != self.name and not consumer["pending"]
                        and consumer["idle"] > 3_600_000):
                    self.broker.client.xgroup_delconsumer(keys.events, GROUP, consumer["name"])


def _rows_from_events(queue: str, by_job: dict[str, list[Event]],
                      now: dt.datetime) -> list[table.Row]:
    """The rows of jobs whose hash is gone: each stored row (locked, so that no other
    writer changes it meanwhile) with the events newer than it applied in order."""
    rows = []
    for job_id, job in table.lock_rows(queue, by_job).items():
        newer = [event for event in by_job[job_id]
                 if event.order > (job.last_event_ms, job.last_event_seq)]
        if not newer:
            continue  # another writer got there first
        for event in newer:
            apply_event(job, event)
        row = table.row_of(job)
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
        return Job._meta.db_table in connection.introspection.table_names()
    except DatabaseError:
        return True  # the database is down: the mirror's own backoff handles it
