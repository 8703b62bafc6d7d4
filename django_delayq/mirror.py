"""The model mirror: each queue shard's events stream -> :class:`django_delayq.models.Job`.

Reads go through one consumer group per stream (:data:`GROUP`), so any number of
mirrors (one per worker process, or ``manage.py delayq_mirror``) share the work. An
entry is acknowledged only after the database transaction holding its row commits: a
crash or a database outage loses nothing, the entries stay pending and are read again
(the consumer's own pending entries first, then other consumers' entries idle for longer
than ``claim_idle``). Writes are idempotent: a row remembers the stream id of the newest
event applied to it (``last_event_id``) and an older event never overwrites it.

Redis stays the source of truth: a row is built from the job HASH read at mirror time
(its newest state), or from the event alone when the hash is gone (result TTL, purge).
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
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, close_old_connections, connection, connections, transaction
from django.db.models import Q
from django.utils import timezone
from redis.exceptions import RedisError, ResponseError

from .conf import conf
from .connection import get_broker
from .engine import Broker, Queue
from .engine.errors import DelayQConnectionError
from .engine.job import _decode_or_raw, from_ms
from .engine.keys import STATUSES, QueueKeys
from .models import Job, JobStatus

logger = logging.getLogger(__name__)

GROUP = "delayq-mirror"
#: Fields an upsert rewrites (everything but the key and the primary key).
UPDATE_FIELDS = [
    "task_name", "status", "priority", "args", "kwargs", "run_at", "enqueued_at",
    "started_at", "finished_at", "attempts", "max_attempts", "worker", "result", "error",
    "traceback", "last_event_id", "updated_at",
]
FINISHED = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PURGED)
#: Test hook: seconds to sleep after the database commit and before XACK.
PAUSE_BEFORE_ACK_ENV = "DELAYQ_MIRROR_PAUSE_BEFORE_ACK"


def stream_id(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a comparable ``(ms, seq)`` pair; raises ValueError."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True)
class Event:
    """One decoded entry of an events stream."""

    keys: QueueKeys
    entry_id: str
    event: str
    job_id: str
    fields: dict[str, str]

    @property
    def order(self) -> tuple[int, int]:
        return stream_id(self.entry_id)

    @property
    def at(self) -> dt.datetime | None:
        return from_ms(self.fields.get("ts"))


def parse_entry(keys: QueueKeys, entry_id: str, fields: dict[str, str] | None) -> Event | None:
    """Decode a stream entry; None (after a warning) when it is garbled."""
    try:
        stream_id(entry_id)
        event, job_id = fields["event"], fields["job"]  # type: ignore[index]
        int(fields.get("ts", "0"))  # type: ignore[union-attr]
        if not event or not job_id:
            raise ValueError("empty event or job")
    except (KeyError, TypeError, ValueError) as exc:
        logger.warning("skipping garbled event stream=%s id=%s fields=%r error=%s",
                       keys.events, entry_id, fields, exc)
        return None
    return Event(keys, entry_id, event, job_id, dict(fields))


def row_from_hash(queue: str, job_id: str, data: dict[str, str]) -> Job:
    """A model instance holding a job HASH's state."""
    def num(name: str, default: int) -> int:
        try:
            return int(data.get(name, default))
        except (TypeError, ValueError):
            return default

    status = data.get("status", "")
    return Job(
        queue=queue, job_id=job_id, task_name=data.get("task", "")[:200],
        status=status if status in STATUSES else JobStatus.READY,
        priority=num("priority", 0),
        args=_decode_or_raw(data.get("args"), []), kwargs=_decode_or_raw(data.get("kwargs"), {}),
        run_at=from_ms(data.get("run_at")), enqueued_at=from_ms(data.get("enqueued_at")),
        started_at=from_ms(data.get("started_at")), finished_at=from_ms(data.get("finished_at")),
        attempts=max(0, num("attempts", 0)), max_attempts=max(1, num("max_attempts", 1)),
        worker=(data.get("worker") or "")[:200], result=_decode_or_raw(data.get("result"), None),
        error=data.get("error") or "", traceback=data.get("traceback") or "",
    )


def apply_event(row: Job, event: Event) -> None:
    """Update ``row`` from an event alone (its job HASH is gone)."""
    f, at = event.fields, event.at
    attempt = f.get("attempt")
    if attempt and attempt.isdigit():
        row.attempts = int(attempt)
    kind = event.event
    if kind == "enqueued":
        row.status = row.status or JobStatus.READY
        row.enqueued_at = row.enqueued_at or at
    elif kind == "started":
        row.status, row.started_at, row.finished_at = JobStatus.ACTIVE, at, None
        row.worker = (f.get("worker") or row.worker)[:200]
    elif kind == "completed":
        row.status, row.finished_at = JobStatus.COMPLETED, at
    elif kind == "failed":
        row.status, row.finished_at = JobStatus.FAILED, at
        row.error = f.get("error", row.error)
    elif kind == "cancelled":
        row.status, row.finished_at = JobStatus.CANCELLED, at
    elif kind in ("retried", "rescheduled"):
        run_at = from_ms(f.get("run_at"))
        row.run_at = run_at or row.run_at
        due = run_at is None or (at is not None and run_at <= at)
        row.status = JobStatus.READY if due else JobStatus.SCHEDULED
        row.finished_at = None
        if f.get("manual"):
            row.attempts, row.error, row.traceback = 0, "", ""
    elif kind in ("reclaimed", "released"):
        row.status = JobStatus.READY
    elif kind in ("purged", "orphaned"):
        row.status = JobStatus.PURGED
        row.finished_at = row.finished_at or at
    else:
        logger.warning("unknown event kind, keeping status event=%s job=%s", kind, event.job_id)


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
        self._pause_before_ack = float(os.environ.get(PAUSE_BEFORE_ACK_ENV) or 0)

    # -- control -------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, *, burst: bool = False, timeout: float | None = None) -> int:
        """Mirror until stopped (or, with ``burst``, until the streams are drained).

        ``timeout`` bounds the run in seconds. Returns the number of events applied.
        """
        logger.info("mirror started consumer=%s group=%s burst=%s", self.name, GROUP, burst)
        backoff = 0.5
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() > deadline:
                break
            try:
                done = self.step(block=not burst)
                backoff = 0.5
                if burst and done == 0:
                    break
            except (RedisError, DelayQConnectionError) as exc:
                logger.warning("mirror cannot reach Redis, retrying in %.1fs error=%s",
                               backoff, exc)
                self._ready.clear()
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            except DatabaseError as exc:
                logger.warning("mirror cannot write to the database, retrying in %.1fs "
                               "error=%s", backoff, exc)
                if not connection.in_atomic_block:
                    close_old_connections()  # drop a broken connection; reconnect next round
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
        logger.info("mirror stopped consumer=%s mirrored=%d", self.name, self.mirrored)
        return self.mirrored

    # -- one round -----------------------------------------------------------------

    def step(self, *, block: bool = False) -> int:
        """Read and apply one batch from every shard. Returns how many entries it handled."""
        self._refresh_shards()
        self._maybe_prune()
        handled = 0
        for keys in self._shards:
            handled += self._step_shard(keys)
        if handled == 0 and block and self._shards and not self._stop.is_set():
            handled += self._wait_and_read()
        elif handled == 0 and block:
            self._stop.wait(self.block_ms / 1000)
        return handled

    def _refresh_shards(self) -> None:
        now = time.monotonic()
        if self._shards and now - self._refreshed_at < self.refresh_interval:
            return
        names = self.fixed_queues or [q.name for q in Queue.all(broker=self.broker)]
        self._shards = [k for name in names for k in self.broker.shards(name)]
        self._refreshed_at = now
        for keys in self._shards:
            self._ensure_group(keys)

    def _ensure_group(self, keys: QueueKeys) -> None:
        if keys.events in self._ready:
            return
        try:
            self.broker.client.xgroup_create(keys.events, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._ready.add(keys.events)

    def _read(self, streams: dict[str, str], block: int | None = None) -> list[Any]:
        try:
            return self.broker.client.xreadgroup(
                GROUP, self.name, streams, count=self.batch_size, block=block) or []
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._ready.clear()  # the stream was deleted: recreate the groups next round
            self._refreshed_at = 0.0
            return []

    def _step_shard(self, keys: QueueKeys) -> int:
        client = self.broker.client
        entries: list[tuple[str, dict[str, str] | None]] = []
        if keys.events not in self._recovered:
            # Our own pending entries first (a restart with the same consumer name).
            for _, got in self._read({keys.events: "0"}):
                entries.extend(got)
            if not entries:
                self._recovered.add(keys.events)
        if not entries and self.claim_idle_ms >= 0:
            reply = client.xautoclaim(keys.events, GROUP, self.name, self.claim_idle_ms,
                                      start_id="0-0", count=self.batch_size)
            entries = [e for e in reply[1] if e is not None] if len(reply) > 1 else []
            if entries:
                logger.info("mirror took over pending events stream=%s count=%d",
                            keys.events, len(entries))
        if not entries:
            for _, got in self._read({keys.events: ">"}):
                entries.extend(got)
        if entries:
            self._apply(keys, entries)
        return len(entries)

    def _wait_and_read(self) -> int:
        """Block on every shard's stream at once until something arrives."""
        streams = {keys.events: ">" for keys in self._shards}
        by_stream = {keys.events: keys for keys in self._shards}
        handled = 0
        for stream, got in self._read(streams, block=self.block_ms):
            if got:
                self._apply(by_stream[stream], got)
                handled += len(got)
        return handled

    # -- writing -------------------------------------------------------------------

    def _apply(self, keys: QueueKeys, entries: list[tuple[str, dict[str, str] | None]]) -> None:
        ids = [entry_id for entry_id, _ in entries]
        by_job: dict[str, list[Event]] = {}
        for entry_id, fields in entries:
            event = parse_entry(keys, entry_id, fields)
            if event is None:
                self.skipped += 1
                continue
            by_job.setdefault(event.job_id, []).append(event)
        logger.debug("mirror read batch stream=%s entries=%d jobs=%d", keys.events,
                     len(entries), len(by_job))
        if by_job:
            for events in by_job.values():
                events.sort(key=lambda e: e.order)
            self._write(keys, by_job)
        if self._pause_before_ack:
            logger.info("mirror wrote batch, pausing before ack stream=%s entries=%d",
                        keys.events, len(entries))
            time.sleep(self._pause_before_ack)
        self.broker.client.xack(keys.events, GROUP, *ids)
        self.mirrored += len(entries)

    def _write(self, keys: QueueKeys, by_job: dict[str, list[Event]]) -> None:
        """Upsert one row per job, in one transaction; ``by_job`` events are oldest first.

        A row takes its job HASH's state when the hash exists, else the events newer than
        the row, applied in order.
        """
        queue = keys.queue
        job_ids = sorted(by_job)
        with transaction.atomic():
            # Placeholders make every row lockable, so concurrent mirrors apply their
            # batches one after the other (each reads the job hashes once it holds the lock).
            Job.objects.bulk_create(
                [Job(queue=queue, job_id=j, status=JobStatus.READY) for j in job_ids],
                ignore_conflicts=True)
            existing = {row.job_id: row for row in Job.objects.select_for_update()
                        .filter(queue=queue, job_id__in=job_ids).order_by("job_id")}
            todo = [j for j in job_ids if _newer(by_job[j][-1], existing.get(j))]
            if not todo:
                return
            pipe = self.broker.client.pipeline(transaction=False)
            for job_id in todo:
                pipe.hgetall(keys.job(job_id))
            hashes = pipe.execute()
            now = timezone.now()
            rows = []
            for job_id, data in zip(todo, hashes, strict=True):
                event = by_job[job_id][-1]
                if data:
                    row = row_from_hash(queue, job_id, data)
                else:
                    row = existing.get(job_id) or Job(queue=queue, job_id=job_id)
                    for older in by_job[job_id]:
                        if _newer(older, row):
                            apply_event(row, older)
                row.pk = None  # upserted on (queue, job_id), never by primary key
                row.last_event_id, row.updated_at = event.entry_id, now
                rows.append(row)
            Job.objects.bulk_create(rows, update_conflicts=True,
                                    unique_fields=["queue", "job_id"],
                                    update_fields=UPDATE_FIELDS)

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
        old = Job.objects.filter(status__in=FINISHED).filter(
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


def _newer(event: Event, row: Job | None) -> bool:
    if row is None or not row.last_event_id:
        return True
    try:
        return event.order > stream_id(row.last_event_id)
    except ValueError:
        return True


class MirrorThread:
    """A :class:`Mirror` on a daemon thread (what ``runworker`` starts)."""

    def __init__(self, **kwargs: Any) -> None:
        self.mirror = Mirror(**kwargs)
        self._thread = threading.Thread(target=self._run, name="delayq-mirror", daemon=True)
        self._enabled = False

    def _run(self) -> None:
        if not _table_exists():
            logger.warning("the mirror is off: table %s is missing (run manage.py migrate)",
                           Job._meta.db_table)
            return
        self._enabled = True
        try:
            self.mirror.run()
        finally:
            connections.close_all()  # this thread's own connections

    def start(self) -> MirrorThread:
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0, *, drain: bool = False) -> None:
        """Stop the thread; with ``drain``, then mirror what is left (at most ``timeout``)."""
        self.mirror.request_stop()
        self._thread.join(timeout)
        if drain and self._enabled and not self._thread.is_alive():
            self.mirror._stop.clear()
            self.mirror.run(burst=True, timeout=timeout)


def _table_exists() -> bool:
    try:
        return Job._meta.db_table in connection.introspection.table_names()
    except DatabaseError:
        return True  # the database is down: the mirror's own backoff handles it
