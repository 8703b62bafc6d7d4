"""One stream consumer: reads every queue shard's events stream through a consumer group
of its own, in batches, and hands each batch to its sink.

The model mirror (rows, :mod:`django_delayq.mirror`) and the lake exporter (Parquet
files, :mod:`django_delayq.lake`) are its two sinks: each subclass says how a batch is
written (:meth:`StreamConsumer.write`), which of its errors mean "not now" (:attr:`stalls`)
and what it does now and then (:meth:`maintain`). The consumer does the rest, once:

- a round reads this consumer's batch in progress first (after a crash or an error, at
  once), then the batches of consumers that are gone (their process ended: at once),
  then those of others idle for ``claim_idle``, then new entries of every shard in one
  round trip, and waits for new ones (a blocking read) when there were none;
- a batch is acknowledged only once its sink has written it: a crash or an outage of
  Redis, the database or the filesystem loses nothing, the batch is written again whole
  (:mod:`~django_delayq.engine.streams`);
- entries the streams' cap trimmed before the group read them are counted as lost;
- an entry is decoded into its events for every sink alike (:func:`parse_entry`), so
  the sinks skip the same garbled entries for the same reasons (the lake skips,
  besides, an entry whose times or attempt its columns cannot hold).

It is a host's service (``run``/``stop``) and runs alone too (``run(burst=True)``).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine import Broker, DelayQError, markers, streams
from ..engine.backoff import Backoff
from ..engine.fields import FORMAT
from ..engine.jobhash import checked_ms, from_ms
from ..engine.keys import QueueKeys, split_job_ids, validate_job_id
from ..engine.logfields import log
from ..engine.streams import Entry, StreamBatch
from ..engine.workers import new_worker_name

logger = logging.getLogger("django_delayq.mirror")

#: Seconds between two looks for consumers that are gone (their batches taken at once).
GONE_CHECK_EVERY = 2.0
#: A gone consumer's batch is taken once idle this long (ms), so that of the consumers
#: that see it gone at about the same time, one takes it.
GONE_IDLE_MS = 1_000
#: Seconds between two forgettings of consumers idle with nothing pending.
FORGET_EVERY = 300.0
FORGET_IDLE_MS = 3_600_000


class StreamConsumer:
    """Reads the events streams of every queue (or of ``queues``) and writes each batch
    with :meth:`write`; a subclass is a sink."""

    #: The consumer group, and how this reader names itself in logs and skip records.
    group = ""
    reader = ""
    #: Errors of the sink that stop a batch, to be written again later (a database or a
    #: filesystem that is away); any other error of one entry is the sink's to skip.
    stalls: tuple[type[BaseException], ...] = ()
    #: What the sink writes to, in log lines ("cannot write to ...").
    writes_to = ""

    def __init__(self, broker: Broker, *, name: str | None = None, batch_size: int = 1_000,
                 block: float = 1.0, claim_idle: float = 60.0,
                 queues: Sequence[str] | None = None, refresh_interval: float = 10.0,
                 consumers_gone: Callable[[list[str]], set[str]] | None = None) -> None:
        self.broker = broker
        self.name = name or new_worker_name()
        self.batch_size = batch_size
        self.block = block
        self.claim_idle_ms = int(claim_idle * 1000)
        self.fixed_queues = list(queues) if queues else None
        self.refresh_interval = refresh_interval
        #: Which of the consumers named are certainly gone (taken over at once).
        self._consumers_gone = consumers_gone or (lambda consumers: set())
        self.entries = 0  # entries acknowledged
        self.lost = 0  # entries trimmed from a stream before this group read them
        self.skipped = 0  # events left out (garbled, or none of the sink could write)
        self._stop = threading.Event()
        self._drain = False
        self._shards: list[QueueKeys] = []
        self._ready: set[str] = set()  # streams whose group exists
        self._recovered: set[str] = set()  # streams whose own batch was taken back
        self._tails: dict[str, str] = {}  # stream -> its newest id, as last read
        self._trimmed_seen: dict[str, int] = {}
        self._refreshed_at = 0.0
        self._claim_due = 0.0
        self._gone_due = 0.0
        self._forget_due = 0.0
        self._claim_every = min(max(self.claim_idle_ms / 2000, 1.0), 30.0)

    # -- the sink -------------------------------------------------------------------

    def write(self, keys: QueueKeys, batch: StreamBatch, *, recovered: bool) -> None:
        """Write ``batch`` of the shard ``keys`` durably (``recovered``: it was read
        before, maybe written in part). Raise one of :attr:`stalls` to write it later."""
        raise NotImplementedError

    def destination(self) -> dict[str, Any]:
        """Where the sink writes, as fields of its start record (never a password)."""
        return {}

    def recover(self) -> None:
        """After a stall of the sink (a subclass drops a broken connection)."""

    def maintain(self) -> None:
        """Now and then, between rounds (a subclass prunes what it keeps)."""

    def skip(self, keys: QueueKeys, entry_id: str, reason: str, *, events: int = 1) -> None:
        """Leave an entry out (``events`` of it, counted in :attr:`skipped`), where
        operators see it: ``Queue.skipped_events()`` (the dashboard, the API), and a log
        line with its stream id and the reason."""
        self.skipped += events
        reason = streams.record_skip(self.broker, keys, self.reader, entry_id, reason)
        log(logger, logging.ERROR, f"{self.reader} skipped an event it cannot apply",
            stream=keys.events, id=entry_id, reason=reason)

    # -- control ----------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def drain(self, timeout: float | None = None) -> int:
        """Once :meth:`run` has returned after a stop, consume what is left (at most
        ``timeout`` seconds); return the number of entries acknowledged."""
        self._stop.clear()
        return self.run(burst=True, timeout=timeout)

    def stop(self, *, drain: bool) -> None:
        """The host's stop: :meth:`run` returns, after a drain (5 s at most) if asked,
        at once if it waits for entries."""
        self._drain = drain
        self._stop.set()
        wake = self._wake_key()
        if wake is not None:
            # Redis away: the wait ends by itself within `block`
            with contextlib.suppress(DelayQError):
                streams.wake_reader(self.broker, wake)

    def _wake_key(self) -> str | None:
        """The stream its idle wait also watches, to be woken by a stop."""
        return markers.wake_key(self._shards[0].tag, self.name) if self._shards else None

    def run(self, *, burst: bool = False, timeout: float | None = None) -> int:
        """Consume until stopped (``burst``: until the streams are drained); ``timeout``
        bounds it in seconds. Returns the number of entries acknowledged by this run.
        Errors of Redis and stalls of the sink are logged and retried with a backoff."""
        log(logger, logging.INFO, f"{self.reader} started", **self.destination(),
            consumer=self.name, group=self.group, burst=burst)
        before = self.entries
        backoff = Backoff(self._stop, first=0.5, cap=30.0)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() > deadline:
                break
            try:
                done = self.step(wait=not burst)
                backoff.reset()
                if burst and done == 0:
                    break
            except DelayQError as exc:
                log(logger, logging.WARNING, f"{self.reader} cannot reach Redis",
                    retry_in_s=backoff.delay, consumer=self.name, error=exc)
                self._ready.clear()
                self._recovered.clear()
                backoff.wait()
            except self.stalls as exc:
                log(logger, logging.WARNING, f"{self.reader} cannot write to {self.writes_to}",
                    retry_in_s=backoff.delay, consumer=self.name, error=exc)
                self._recovered.clear()  # its batch is pending: take it back next round
                self.recover()
                backoff.wait()
            except Exception:
                log(logger, logging.ERROR, f"{self.reader} round failed", exc_info=True,
                    retry_in_s=backoff.delay, consumer=self.name)
                self._recovered.clear()
                backoff.wait()
        log(logger, logging.INFO, f"{self.reader} stopped", consumer=self.name,
            entries=self.entries)
        if self._drain and not burst:
            self._drain = False
            self.drain(5.0)  # what the workers that stopped before this wrote last
        return self.entries - before

    # -- one round ----------------------------------------------------------------------

    def step(self, *, wait: bool = False) -> int:
        """One round over every shard; returns how many entries it handled. With
        ``wait``, a round that found nothing waits (``block`` seconds at most) for new
        entries."""
        self._refresh_shards()
        self.maintain()
        handled = 0
        for keys in self._shards:
            if keys.events not in self._recovered:
                mine = self._claim(keys, self.name, 0)
                if mine is not None:
                    handled += self._finish(keys, mine)
                    continue
                self._recovered.add(keys.events)
        now = time.monotonic()
        if now >= self._gone_due:
            self._gone_due = now + GONE_CHECK_EVERY
            handled += sum(self._take_over(keys, gone_only=True) for keys in self._shards)
        if now >= self._claim_due:
            taken = sum(self._take_over(keys, gone_only=False) for keys in self._shards)
            handled += taken
            self._claim_due = 0.0 if taken else now + self._claim_every
        if now >= self._forget_due:
            self._forget_due = now + FORGET_EVERY
            for keys in self._shards:
                streams.forget_idle_consumers(self.broker, keys, self.group, self.name,
                                              FORGET_IDLE_MS)
        ready = [keys for keys in self._shards if keys.events in self._recovered]
        try:
            batches = streams.read_batches(self.broker, ready, self.group, self.name,
                                           self.batch_size) if ready else []
        except streams.BatchInProgress:
            self._recovered.clear()  # take them back next round
            return handled
        except streams.GroupGone:
            self._group_gone()
            return handled
        for keys, batch, tail in batches:
            self._tails[keys.events] = tail
            if batch is not None:
                handled += self._finish(keys, batch, recovered=False)
        if not handled and wait and not self._stop.is_set() and not (
                self._tails and streams.wait_for_entries(
                    self.broker, self._tails, int(self.block * 1000), self._wake_key())):
            self._stop.wait(self.block)
        return handled

    def _claim(self, keys: QueueKeys, owner: str, min_idle_ms: int) -> StreamBatch | None:
        try:
            return streams.claim_batch(self.broker, keys, self.group, owner, self.name,
                                       min_idle_ms, self.batch_size)
        except streams.GroupGone:
            self._group_gone()
            return None

    def _take_over(self, keys: QueueKeys, *, gone_only: bool) -> int:
        """Finish the batches of other consumers: those gone (idle for a second), or any
        idle for ``claim_idle`` (a slow one's batch is then written twice, never split)."""
        try:
            owners = [o for o in streams.pending_consumers(self.broker, keys, self.group)
                      if o != self.name]
        except streams.GroupGone:
            self._group_gone()
            return 0
        if gone_only:
            owners = sorted(self._consumers_gone(owners)) if owners else []
        handled = 0
        for owner in owners:
            batch = self._claim(keys, owner, GONE_IDLE_MS if gone_only else self.claim_idle_ms)
            if batch is None and gone_only:
                # read by it moments before it died: nobody else will take it, so wait
                # (once) for it to be idle rather than leave it (a burst would end)
                time.sleep(GONE_IDLE_MS / 1000)
                batch = self._claim(keys, owner, GONE_IDLE_MS)
            if batch is not None:
                log(logger, logging.INFO, f"{self.reader} took over a batch",
                    stream=keys.events, owner=owner, entries=len(batch.entries),
                    consumer=self.name)
                handled += self._finish(keys, batch)
        return handled

    def _finish(self, keys: QueueKeys, batch: StreamBatch, *, recovered: bool = True) -> int:
        """Write a batch, then acknowledge it; entries trimmed meanwhile count as lost."""
        gone = len(batch.deleted) + sum(1 for _, fields in batch.entries if fields is None)
        if gone:
            self._lose(keys, gone)
        self.write(keys, batch, recovered=recovered)
        self._acknowledge(keys, batch)
        self.entries += len(batch.entries)
        return len(batch.entries)

    def _acknowledge(self, keys: QueueKeys, batch: StreamBatch) -> None:
        """Acknowledge a batch whose work is durable (what a crash may fall between)."""
        streams.ack_batch(self.broker, keys, self.group, self.name, batch)

    def _refresh_shards(self) -> None:
        now = time.monotonic()
        if self._shards and now - self._refreshed_at < self.refresh_interval:
            return
        self._shards = streams.shards_to_read(self.broker, self.fixed_queues)
        self._refreshed_at = now
        for keys in self._shards:
            if keys.events not in self._ready:
                streams.ensure_group(self.broker, keys, self.group)
                self._ready.add(keys.events)
            self._check_trimmed(keys)

    def _group_gone(self) -> None:
        """A stream or its group was deleted (FLUSHDB, a Redis without persistence
        restarted): create the groups again on the next round."""
        self._ready.clear()
        self._tails.clear()
        self._refreshed_at = 0.0

    def _check_trimmed(self, keys: QueueKeys) -> None:
        unread = streams.unread_trimmed(self.broker, keys, self.group)
        if unread is None:
            return
        new = unread - self._trimmed_seen.get(keys.events, 0)
        if new > 0:
            self._lose(keys, new)
        self._trimmed_seen[keys.events] = max(unread, self._trimmed_seen.get(keys.events, 0))

    def _lose(self, keys: QueueKeys, count: int) -> None:
        self.lost += count
        log(logger, logging.ERROR, f"events trimmed from the stream before the {self.reader} "
            "read them (raise DELAYQ['EVENTS_MAXLEN'] or read more often)",
            stream=keys.events, count=count)



def entries_of(batch: StreamBatch) -> list[tuple[str, dict[str, Any]]]:
    """The entries of ``batch`` still in the stream (a trimmed one has no fields)."""
    return [(entry_id, fields) for entry_id, fields in batch.entries if fields is not None]


# -- an entry decoded, the same for every sink: both skip the same entries ------------

#: The largest part of an entry id a sink stores (SQL bigints, Parquet int64).
MAX_ID_PART = 2**63 - 1


def stream_id(entry_id: str) -> tuple[int, int]:
    """A stream entry id as a comparable ``(ms, seq)`` pair; raises ValueError (for an id
    whose parts a sink cannot store, too)."""
    ms_text, _, seq_text = entry_id.partition("-")
    ms, seq = int(ms_text), int(seq_text or 0)
    if not (0 <= ms <= MAX_ID_PART and 0 <= seq <= MAX_ID_PART):
        raise ValueError(f"stream id out of range: {entry_id[:60]}")
    return ms, seq


@dataclass(slots=True)
class Event:
    """One decoded entry of an events stream, for one of the jobs it names."""

    entry_id: str
    #: ``entry_id`` as numbers (:func:`stream_id`): events sort by it.
    order: tuple[int, int]
    event: str
    job_id: str
    #: The attempt of this job the entry reports, as stored (None: not given).
    attempt: str | None
    #: The entry's fields, shared by the events of every job it names.
    fields: dict[str, str]

    @property
    def at(self) -> dt.datetime | None:
        return from_ms(self.fields.get("ts"))  # checked by parse_entry


def parse_entry(keys: QueueKeys, entry_id: str, fields: dict[str, str] | None,
                on_garbled: Callable[[str], None] | None = None) -> list[Event]:
    """Decode a stream entry into its events: one per job it names.

    An entry for several jobs (a bulk enqueue, a claim, an ack) names them in ``jobs`` and
    may give each its attempt in ``attempts``, in the same order. Empty when the entry is
    garbled (given to ``on_garbled`` with the reason, whose skip logs it: one record per
    entry; without it, a warning) or trimmed (a warning).
    """
    if fields is None:
        log(logger, logging.WARNING, "event trimmed from the stream before it was mirrored",
            stream=keys.events, id=entry_id)
        return []
    try:
        order = stream_id(entry_id)
        event = fields["event"]
        attempts: Sequence[str | None]
        # An id no job can have would fail its row's insert (PostgreSQL enforces the
        # column length): a poison entry that would stall the stream.
        if "jobs" not in fields:
            job_ids, attempts = [validate_job_id(fields["job"])], [fields.get("attempt")]
        else:
            job_ids = split_job_ids(fields["jobs"])
            if "attempts" in fields:
                attempts = fields["attempts"].split(" ")
            else:
                attempts = [None] * len(job_ids)
            if len(attempts) != len(job_ids):
                raise ValueError("jobs and attempts differ in length")
        checked_ms(fields.get("ts"))  # a time every reader can represent (ValueError if not)
        if not event:
            raise ValueError("empty event")
        if int(fields.get("fv", "1")) > FORMAT:  # absent: format 1, every release so far
            raise ValueError(f"event format {fields['fv']} is newer than this version "
                             f"reads ({FORMAT})")
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        if on_garbled is not None:
            on_garbled(f"garbled event: {type(exc).__name__}: {exc}")
        else:
            log(logger, logging.WARNING, "skipping garbled event", stream=keys.events,
                id=entry_id, fields=repr(fields), error=exc)
        return []
    return [Event(entry_id, order, event, job_id, attempt, fields)
            for job_id, attempt in zip(job_ids, attempts, strict=True)]


__all__ = ["Entry", "Event", "StreamConsumer", "entries_of", "parse_entry", "stream_id"]
