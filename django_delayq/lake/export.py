"""The exporter: every queue shard's events stream -> the lake's Parquet files.

It reads through its own consumer group (:data:`GROUP`), so its position and its
acknowledgements are independent of the model mirror's. It reads in batches
(:mod:`~django_delayq.engine.streams`: a script reads the entries and records their
range as this exporter's batch in progress). A batch is written as one file per UTC day
(and about :data:`ROWS_PER_FILE` rows), named by the entries it holds, and acknowledged
only once its files are durable (:func:`.store.write`). A crash in between leaves the
batch pending: this exporter takes it back, or another one takes it over once it is
idle, always whole, and writes the same files again (replacing them). Entries of a batch
taken back or over are also checked against the files already written (a file's name
gives the range of stream ids it may hold, its ``stream_id`` column the ids it does), so
no event is in the lake twice.

The streams are capped (``DELAYQ["EVENTS_MAXLEN"]``, an approximate ``MAXLEN`` trim on
every append, blind to consumer groups): entries trimmed before the exporter read them
are gone. The exporter counts them (:attr:`Exporter.lost`) and logs an error; keep the
cap above the events a queue shard appends while the exporter may be behind.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import pyarrow as pa
from redis.exceptions import RedisError, ResponseError

from ..engine import Broker, streams
from ..engine.backoff import Backoff
from ..engine.errors import DelayQConnectionError
from ..engine.fields import stored
from ..engine.jobhash import JobHash, read_job_hash, to_ms
from ..engine.keys import QueueKeys
from ..engine.urls import redact
from ..engine.validation import check_time_ms
from . import store
from .schema import ARROW_SCHEMA, day_of

logger = logging.getLogger(__name__)

#: The consumer group every exporter reads through (the mirror's is ``delayq-mirror``).
GROUP = "delayq-lake"
#: Events whose rows take fields of the job hash.
_ENQUEUED = "enqueued"
_ENDS_ATTEMPT = frozenset(("completed", "failed", "retried"))
#: Job hash fields read at export time (their stored names).
_STORED = tuple(stored(name) for name in ("status", "task", "run_at", "enqueued_at",
                                          "priority", "max_attempts", "attempt_log"))
_PIPELINE = 5_000
MAX_INT32 = 2**31 - 1
#: Rows a file holds at most (about: a file ends after the entry that reaches it).
ROWS_PER_FILE = 250_000


class Exporter:
    """Appends the events of every queue (or of ``queues``) to the lake at ``where``.

    ``run()`` loops until :meth:`request_stop`; ``run(burst=True)`` exports what the
    streams hold and returns. Redis errors are logged and retried with a capped backoff.
    """

    def __init__(self, where: str, *, broker: Broker, name: str | None = None,
                 batch_size: int = 2_000, block: float = 1.0, claim_idle: float = 60.0,
                 queues: Iterable[str] | None = None, refresh_interval: float = 10.0) -> None:
        self.where = where
        self.filesystem, self.root = store.open_lake(where)
        self.broker = broker
        # Stable across restarts on one host: a restarted exporter re-reads its own
        # pending entries at once (others' only after claim_idle).
        self.name = name or f"{socket.gethostname()}:lake"
        self.batch_size = batch_size
        self.block = block
        self.claim_idle_ms = int(claim_idle * 1000)
        self.fixed_queues = list(queues) if queues else None
        self.refresh_interval = refresh_interval
        self.rows = 0      # rows written (one per job per entry)
        self.entries = 0   # entries acknowledged
        self.files = 0     # files written
        self.lost = 0      # entries trimmed from a stream before the exporter read them
        self.skipped = 0   # garbled entries acknowledged without a row
        self._stop = threading.Event()
        self._shards: list[QueueKeys] = []
        self._ready: set[str] = set()
        self._recovered: set[str] = set()
        self._refreshed_at = 0.0
        self._claim_due = 0.0
        self._trimmed_seen: dict[str, int] = {}

    # -- control ---------------------------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()

    def drain(self, timeout: float) -> int:
        """Once :meth:`run` has returned after a stop, export what is left (at most
        ``timeout`` seconds); return the number of entries acknowledged."""
        self._stop.clear()
        return self.run(burst=True, timeout=timeout)

    def run(self, *, burst: bool = False, timeout: float | None = None) -> int:
        """Export until stopped (``burst``: until the streams are drained); return the
        number of entries acknowledged by this run."""
        logger.info("lake export started lake=%s consumer=%s burst=%s", redact(self.where),
                    self.name, burst)
        before = self.entries
        backoff = Backoff(self._stop, first=0.5, cap=30.0)
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._stop.is_set():
            if deadline is not None and time.monotonic() > deadline:
                break
            try:
                done = self.step()
                backoff.reset()
            except (RedisError, DelayQConnectionError) as exc:
                logger.warning("lake export cannot reach Redis, retrying in %.1fs error=%s",
                               backoff.delay, exc)
                self._ready.clear()
                self._recovered.clear()
                backoff.wait()
                continue
            except OSError as exc:
                logger.warning("lake export cannot write, retrying in %.1fs error=%s",
                               backoff.delay, exc)
                self._recovered.clear()  # the batch is pending: read it again
                backoff.wait()
                continue
            if done == 0:
                if burst:
                    break
                self._stop.wait(self.block)
        return self.entries - before

    # -- reading ---------------------------------------------------------------------

    def step(self) -> int:
        """Export one batch per stream: this exporter's batch in progress first (after a
        crash or an error), then batches other exporters left idle, then new entries."""
        self._refresh_shards()
        handled = 0
        for keys in self._shards:
            if keys.events not in self._recovered:
                mine = self._claim(keys, self.name, 0)
                if mine is not None:
                    handled += self._export(keys, mine)
                    continue
                self._recovered.add(keys.events)
        if time.monotonic() >= self._claim_due:
            for keys in self._shards:
                handled += self._take_over(keys)
            self._claim_due = time.monotonic() + max(1.0, self.claim_idle_ms / 2000)
        for keys in self._shards:
            try:
                batch = streams.read_batch(self.broker.commands, keys, GROUP, self.name,
                                           self.batch_size)
            except streams.GroupGone:
                self._group_gone(keys)
                continue
            except streams.BatchInProgress:
                self._recovered.discard(keys.events)  # take it back next round
                continue
            if batch is not None:
                handled += self._export(keys, batch, recovered=False)
        return handled

    def _claim(self, keys: QueueKeys, owner: str, min_idle_ms: int) -> streams.StreamBatch | None:
        try:
            return streams.claim_batch(self.broker.commands, keys, GROUP, owner, self.name,
                                       min_idle_ms, self.batch_size)
        except streams.GroupGone:
            self._group_gone(keys)
            return None

    def _group_gone(self, keys: QueueKeys) -> None:
        self._ready.discard(keys.events)
        self._refreshed_at = 0.0

    def _take_over(self, keys: QueueKeys) -> int:
        """Export the batches of other exporters idle for ``claim_idle``, each whole: one
        still being written by a slow exporter is then written twice into the same files
        (the second write replaces the first), never into two."""
        try:
            owners = streams.pending_consumers(self.broker.client, keys.events, GROUP)
        except streams.GroupGone:
            self._group_gone(keys)
            return 0
        handled = 0
        for owner in owners:
            if owner == self.name:
                continue
            batch = self._claim(keys, owner, self.claim_idle_ms)
            if batch is not None:
                logger.info("lake export took over a batch stream=%s from=%s entries=%d",
                            keys.events, owner, len(batch.entries))
                handled += self._export(keys, batch)
        return handled

    def _refresh_shards(self) -> None:
        now = time.monotonic()
        if self._shards and now - self._refreshed_at < self.refresh_interval:
            return
        self._shards = streams.shards_to_read(self.broker, self.fixed_queues)
        self._refreshed_at = now
        for keys in self._shards:
            if keys.events not in self._ready:
                self._create_group(keys)
                self._ready.add(keys.events)
            self._check_trimmed(keys)

    def _create_group(self, keys: QueueKeys) -> None:
        """The group, reading from the stream's first entry; what was trimmed before the
        lake began is not counted as lost."""
        client = self.broker.client
        try:
            info = client.xinfo_stream(keys.events)
            before = int(info["entries-added"]) - int(info["length"])
        except (ResponseError, KeyError, TypeError):
            before = None  # no stream yet
        streams.ensure_group(client, keys.events, GROUP, entries_read=before)

    def _check_trimmed(self, keys: QueueKeys) -> None:
        """Count entries trimmed from the stream before this group read them."""
        client = self.broker.client
        try:
            info = client.xinfo_stream(keys.events)
            group = next((g for g in client.xinfo_groups(keys.events)
                          if g.get("name") == GROUP), None)
        except ResponseError:
            return
        read = None if group is None else group.get("entries-read")
        if read is None or info.get("entries-added") is None:
            return
        unread = max(0, int(info["entries-added"]) - int(info["length"]) - int(read))
        new = unread - self._trimmed_seen.get(keys.events, 0)
        if new > 0:
            self._lose(keys, new)
        self._trimmed_seen[keys.events] = max(unread, self._trimmed_seen.get(keys.events, 0))

    def _lose(self, keys: QueueKeys, count: int) -> None:
        self.lost += count
        logger.error("events trimmed from the stream before the lake export read them "
                     "stream=%s count=%d (raise DELAYQ['EVENTS_MAXLEN'] or export more "
                     "often)", keys.events, count)

    # -- writing ---------------------------------------------------------------------

    def _export(self, keys: QueueKeys, batch: streams.StreamBatch, *,
                recovered: bool = True) -> int:
        """Write a batch (one file per day and about :data:`ROWS_PER_FILE` rows), then
        acknowledge it.

        The files are named by the entries they hold, and a batch is always written
        with the entries it was read with, so writing it again (after a crash, or by an
        exporter that took it over from a slow one) replaces its files. A batch taken
        back or over also leaves out rows that other files hold (its first writer may
        have finished them).
        """
        if batch.deleted:
            self._lose(keys, len(batch.deleted))
        present = [(i, f) for i, f in batch.entries if f is not None]
        if len(present) < len(batch.entries):
            self._lose(keys, len(batch.entries) - len(present))
        for chunk in _chunks(present):
            columns = self._columns(keys, chunk)
            if not columns["stream_id"]:
                continue
            table = pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)
            for day, part in _by_day(table):
                if recovered:
                    part = self._not_yet_written(keys, day, part)
                if part.num_rows:
                    self._write(keys, day, part)
        self._acknowledge(keys, batch)
        self.entries += len(batch.entries)
        return len(batch.entries)

    def _acknowledge(self, keys: QueueKeys, batch: streams.StreamBatch) -> None:
        """Acknowledge a batch whose files are durable (what a crash may fall between)."""
        streams.ack_batch(self.broker.commands, keys, GROUP, self.name, batch)

    def _write(self, keys: QueueKeys, day: str, part: pa.Table) -> None:
        stream_ids = part.column("stream_id")
        name = store.FileName(keys.queue, keys.shard, str(stream_ids[0]),
                              str(stream_ids[-1]))
        path = store.write(self.filesystem, self.root, day, name, part)
        self.rows += part.num_rows
        self.files += 1
        logger.debug("lake file written path=%s rows=%d", path, part.num_rows)

    def _not_yet_written(self, keys: QueueKeys, day: str, part: pa.Table) -> pa.Table:
        """The rows of ``part`` whose entries no file of the lake holds yet."""
        ms = part.column("stream_ms").to_pylist()
        seq = part.column("stream_seq").to_pylist()
        lo, hi = min(zip(ms, seq, strict=True)), max(zip(ms, seq, strict=True))
        written: set[str] = set()
        for path, name in store.files_of(self.filesystem, self.root, day, keys.queue,
                                         keys.shard):
            if _order(name.first) <= hi and _order(name.last) >= lo:
                written |= store.stream_ids_in(self.filesystem, path)
        if not written:
            return part
        keep = [sid not in written for sid in part.column("stream_id").to_pylist()]
        logger.info("lake export found entries already written stream=%s day=%s count=%d",
                    keys.events, day, keep.count(False))
        return part.filter(pa.array(keep))

    def _columns(self, keys: QueueKeys, entries: list[tuple[str, dict[str, str]]]
                 ) -> dict[str, list[Any]]:
        """The rows of ``entries``, column by column (one row per job per entry)."""
        cols: dict[str, list[Any]] = {name: [] for name in ARROW_SCHEMA.names}
        for entry_id, fields in entries:
            try:
                ms, seq = _order(entry_id)
                event = fields["event"]
                if "jobs" in fields:
                    jobs = fields["jobs"].split(" ")
                    given = fields.get("attempts")
                    attempts = ([_attempt(a) for a in given.split(" ")] if given
                                else [None] * len(jobs))
                    if len(attempts) != len(jobs):
                        raise ValueError("jobs and attempts differ in length")
                else:
                    jobs, attempts = [fields["job"]], [_attempt(fields.get("attempt"))]
                if not event or not all(jobs):
                    raise ValueError("empty event or job")
                ts = _time_ms(fields["ts"])
                run_at = _time_ms(fields.get("run_at"))
            except (KeyError, ValueError, AttributeError, TypeError) as exc:
                self._skip(keys, entry_id, f"garbled event: {type(exc).__name__}: {exc}")
                continue
            n = len(jobs)
            cols["stream_id"] += [entry_id] * n
            cols["stream_ms"] += [ms] * n
            cols["stream_seq"] += [seq] * n
            cols["queue"] += [keys.queue] * n
            cols["shard"] += [keys.shard] * n
            cols["event"] += [event] * n
            cols["job_id"] += jobs
            cols["ts"] += [ts] * n
            cols["attempt"] += attempts
            cols["worker"] += [fields.get("worker")] * n
            cols["run_at"] += [run_at] * n
            cols["status"] += [fields.get("status")] * n
            cols["error"] += [fields.get("error")] * n
        self._enrich(keys, cols)
        return cols

    def _skip(self, keys: QueueKeys, entry_id: str, reason: str) -> None:
        """Leave an entry out of the lake, where an operator sees it: counted
        (:attr:`skipped`, ``Queue.skipped_events()``: the dashboard, the API) and logged
        with its stream id and the reason."""
        self.skipped += 1
        reason = streams.record_skip(self.broker.client, keys, "lake export", entry_id,
                                     reason)
        logger.error("lake export skipped an event it cannot write stream=%s id=%s "
                     "reason=%s", keys.events, entry_id, reason)

    def _enrich(self, keys: QueueKeys, cols: dict[str, list[Any]]) -> None:
        """Fill the columns the events do not carry from the job hashes (one HMGET per
        job of the batch that was enqueued or ended an attempt, decoded by the engine's
        one decoder: a damaged field reads as its default, as everywhere)."""
        rows = len(cols["job_id"])
        for name in ("task_name", "priority", "max_attempts", "started_at"):
            cols[name] = [None] * rows
        wanted = sorted({job for job, event in zip(cols["job_id"], cols["event"], strict=True)
                         if event == _ENQUEUED or event in _ENDS_ATTEMPT})
        hashes: dict[str, JobHash] = {}
        client = self.broker.client
        for start in range(0, len(wanted), _PIPELINE):
            part = wanted[start:start + _PIPELINE]
            pipe = client.pipeline(transaction=False)
            for job in part:
                pipe.hmget(keys.job(job), *_STORED)
            for job, values in zip(part, pipe.execute(), strict=True):
                found = {name: v for name, v in zip(_STORED, values, strict=True)
                         if v is not None}
                if found:  # else the job hash is gone: only the event's own fields
                    hashes[job] = read_job_hash(found)
        attempts: dict[str, dict[int, dict[str, Any]]] = {}
        for i in range(rows):
            job = cols["job_id"][i]
            h = hashes.get(job)
            if h is None:
                continue
            if cols["event"][i] == _ENQUEUED:
                cols["task_name"][i] = h.task or None
                cols["priority"][i] = h.priority
                cols["max_attempts"][i] = h.max_attempts
                # A job already retried has the retry's run_at: the first one is lost.
                if not any(a["outcome"] == "retried" for a in h.attempt_log):
                    cols["run_at"][i] = to_ms(h.run_at) or cols["ts"][i]
            else:
                if job not in attempts:
                    attempts[job] = {a["attempt"]: a for a in h.attempt_log}
                entry = attempts[job].get(cols["attempt"][i] or -1)
                if entry is not None:
                    cols["started_at"][i] = to_ms(entry["started_at"])
                    if not cols["worker"][i]:
                        cols["worker"][i] = entry["worker"] or None


def _chunks(entries: list[tuple[str, dict[str, str]]]
            ) -> Iterator[list[tuple[str, dict[str, str]]]]:
    """``entries`` in runs of about :data:`ROWS_PER_FILE` rows (a bulk entry names up to
    1,000 jobs), so that a batch's memory and its files stay bounded."""
    chunk: list[tuple[str, dict[str, str]]] = []
    rows = 0
    for entry in entries:
        chunk.append(entry)
        jobs = entry[1].get("jobs")
        rows += jobs.count(" ") + 1 if jobs else 1
        if rows >= ROWS_PER_FILE:
            yield chunk
            chunk, rows = [], 0
    if chunk:
        yield chunk


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _time_ms(value: str | None) -> int | None:
    """A time of an event (ms), checked to be one every reader can represent."""
    if value is None or value == "":
        return None
    return check_time_ms(int(value), f"time {value[:40]!r}")


def _attempt(value: str | None) -> int | None:
    """An attempt number of an event, checked to fit the column."""
    if value is None or value == "":
        return None
    number = int(value)
    if not 0 <= number <= MAX_INT32:
        raise ValueError(f"attempt {value[:40]!r} is out of range")
    return number


def _by_day(table: pa.Table) -> list[tuple[str, pa.Table]]:
    """``table`` split by the UTC day of its stream ids (a batch rarely spans two)."""
    ms = table.column("stream_ms")
    first, last = day_of(ms[0].as_py()), day_of(ms[-1].as_py())
    if first == last:
        return [(first, table)]
    days = [day_of(v) for v in ms.to_pylist()]
    return [(day, table.filter(pa.array([d == day for d in days])))
            for day in sorted(set(days))]
