"""The exporter: the stream consumer's sink that appends every queue shard's events to
the lake's Parquet files (:class:`~django_delayq.runtime.consumer.StreamConsumer` reads
them, in batches, through the group :data:`GROUP`, apart from the mirror's).

A batch is written as one file per UTC day (and about :data:`ROWS_PER_FILE` rows), named
by the entries it holds, and acknowledged only once its files are durable
(:func:`.store.write`). A crash in between leaves the batch pending: this exporter takes
it back, or another one takes it over (at once if its process has ended, otherwise once
it is idle), always whole. Every batch is checked against the files already written (a
file's name gives the range of stream ids it may hold, its ``stream_id`` column the ids
it does), so no event is in the lake twice: not after a crash, nor when Redis delivers
entries again (a failover to a replica that missed the last acknowledgements and reads).

The streams are capped (``DELAYQ["EVENTS_MAXLEN"]``, an approximate ``MAXLEN`` trim on
every append, blind to consumer groups): entries trimmed before the exporter read them
are gone. The consumer counts them (``lost``) and logs an error; keep the cap above the
events a queue shard appends while the exporter may be behind.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import pyarrow as pa

from ..engine import Broker
from ..engine.fields import stored
from ..engine.jobhash import read_job_fields, to_ms
from ..engine.keys import QueueKeys
from ..engine.logfields import log
from ..engine.streams import StreamBatch
from ..engine.urls import redact
from ..engine.validation import MAX_TIME_MS, MIN_TIME_MS, check_time_ms
from ..engine.workers import consumers_gone
from ..runtime.consumer import StreamConsumer, entries_of, parse_entry, stream_id
from . import store
from .schema import ARROW_SCHEMA, day_of

logger = logging.getLogger(__name__)

#: The consumer group every exporter reads through (the mirror's is ``delayq-mirror``).
GROUP = "delayq-lake"
#: Events whose rows take fields of the job hash.
_ENQUEUED = "enqueued"
_ENDS_ATTEMPT = frozenset(("completed", "failed", "retried"))
#: Job hash fields read at export time (their stored names); the last four give the
#: attempt that completed a job, which its log leaves out (``with_completed_attempt``).
_STORED = tuple(stored(name) for name in (
    "status", "task", "run_at", "enqueued_at", "priority", "max_attempts", "attempt_log",
    "attempts", "worker", "started_at", "finished_at"))
MAX_INT32 = 2**31 - 1
#: Rows a file holds at most (about: a file ends after the entry that reaches it).
ROWS_PER_FILE = 250_000


class Exporter(StreamConsumer):
    """Appends the events of every queue (or of ``queues``) to the lake at ``where``.

    ``run()`` loops until stopped; ``run(burst=True)`` exports what the streams hold and
    returns. ``name`` is its consumer name in the group, by default one of this process
    (``host:pid:random``): two exporters never share one, and the batch of one whose
    process on this host has ended is taken over at once; a name reused takes it back.
    """

    group = GROUP
    reader = "lake export"
    stalls = (OSError,)
    writes_to = "the lake"

    def __init__(self, where: str, *, broker: Broker, name: str | None = None,
                 batch_size: int = 2_000, block: float = 1.0, claim_idle: float = 60.0,
                 queues: Iterable[str] | None = None, refresh_interval: float = 10.0) -> None:
        self.where = where
        self.filesystem, self.root = store.open_lake(where)
        super().__init__(broker, name=name, batch_size=batch_size, block=block,
                         claim_idle=claim_idle, queues=list(queues) if queues else None,
                         refresh_interval=refresh_interval,
                         consumers_gone=partial(consumers_gone, broker))
        self.rows = 0      # rows written (one per job per entry)
        self.files = 0     # files written

    # -- writing ---------------------------------------------------------------------

    def destination(self) -> dict[str, Any]:
        return {"lake": redact(self.where)}

    def write(self, keys: QueueKeys, batch: StreamBatch, *, recovered: bool) -> None:
        """Write a batch (one file per day and about :data:`ROWS_PER_FILE` rows).

        The files are named by the entries they hold, and a batch is always written
        with the entries it was read with, so writing it again (by an exporter that took
        it over from a slow one) replaces its files. Every batch, taken back, over or
        read as new, leaves out the rows that other files hold: its first writer may have
        finished them, and after a failover Redis may deliver again, as new or pending,
        entries already written and acknowledged (with other batch boundaries).
        """
        for chunk in _chunks(entries_of(batch)):
            columns = self._columns(keys, chunk)
            if not columns["stream_id"]:
                continue
            table = pa.Table.from_pydict(columns, schema=ARROW_SCHEMA)
            for day, part in _by_day(table):
                part = self._not_yet_written(keys, day, part)
                if part.num_rows:
                    self._write(keys, day, part)

    def _write(self, keys: QueueKeys, day: str, part: pa.Table) -> None:
        stream_ids = part.column("stream_id")
        name = store.FileName(keys.queue, keys.shard, str(stream_ids[0]),
                              str(stream_ids[-1]))
        path = store.write(self.filesystem, self.root, day, name, part)
        self.rows += part.num_rows
        self.files += 1
        log(logger, logging.DEBUG, "lake file written", path=path, rows=part.num_rows)

    def _not_yet_written(self, keys: QueueKeys, day: str, part: pa.Table) -> pa.Table:
        """The rows of ``part`` whose entries no file of the lake holds yet.

        Costs one listing of the day's directory; a file is opened (its ``stream_id``
        column read) only when its name's range overlaps ``part``'s, which a batch read
        as new never does unless its entries were delivered before."""
        ms = part.column("stream_ms").to_pylist()
        seq = part.column("stream_seq").to_pylist()
        lo, hi = min(zip(ms, seq, strict=True)), max(zip(ms, seq, strict=True))
        written: set[str] = set()
        for path, name in store.files_of(self.filesystem, self.root, day, keys.queue,
                                         keys.shard):
            if stream_id(name.first) <= hi and stream_id(name.last) >= lo:
                written |= store.stream_ids_in(self.filesystem, path)
        if not written:
            return part
        keep = [sid not in written for sid in part.column("stream_id").to_pylist()]
        log(logger, logging.INFO, "lake export found entries already written",
            stream=keys.events, day=day, count=keep.count(False))
        return part.filter(pa.array(keep))

    def _columns(self, keys: QueueKeys, entries: list[tuple[str, dict[str, str]]]
                 ) -> dict[str, list[Any]]:
        """The rows of ``entries``, column by column (one row per job per entry)."""
        cols: dict[str, list[Any]] = {name: [] for name in ARROW_SCHEMA.names}
        for entry_id, fields in entries:
            events = parse_entry(keys, entry_id, fields, partial(self.skip, keys, entry_id))
            if not events:
                continue
            (ms, seq), event = events[0].order, events[0].event
            try:
                attempts = [_attempt(e.attempt) for e in events]
                ts = _time_ms(fields["ts"])
                run_at = _time_ms(fields.get("run_at"))
                if ts is None and not MIN_TIME_MS <= ms <= MAX_TIME_MS:
                    raise ValueError("no time names its day: neither its ts nor its id")
            except (KeyError, ValueError) as exc:
                self.skip(keys, entry_id, f"garbled event: {type(exc).__name__}: {exc}")
                continue
            jobs = [e.job_id for e in events]
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

    def _enrich(self, keys: QueueKeys, cols: dict[str, list[Any]]) -> None:
        """Fill the columns the events do not carry from the job hashes (one HMGET per
        job of the batch that was enqueued or ended an attempt, decoded by the engine's
        one decoder: a damaged field reads as its default, as everywhere)."""
        rows = len(cols["job_id"])
        for name in ("task_name", "priority", "max_attempts", "started_at"):
            cols[name] = [None] * rows
        wanted = sorted({job for job, event in zip(cols["job_id"], cols["event"], strict=True)
                         if event == _ENQUEUED or event in _ENDS_ATTEMPT})
        hashes = read_job_fields(self.broker, keys, wanted, _STORED)
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
    """``table`` split by the UTC day of its stream ids (a batch rarely spans two). An
    id past year 9999 (written on a clock far off: every later id of its stream is
    then past it too) is dated by its event's time instead."""
    ids = table.column("stream_ms").to_pylist()
    times = table.column("ts").cast(pa.int64()).to_pylist()
    days = [day_of(ms if MIN_TIME_MS <= ms <= MAX_TIME_MS else ts)
            for ms, ts in zip(ids, times, strict=True)]
    if len(set(days)) == 1:
        return [(days[0], table)]
    return [(day, table.filter(pa.array([d == day for d in days])))
            for day in sorted(set(days))]
