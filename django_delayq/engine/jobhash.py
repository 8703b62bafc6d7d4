"""The one decoder of a job HASH: stored names and text in, typed values out.

:class:`~django_delayq.engine.Job` and the model mirror both read a job through
:func:`read_job_hash`, so a field's default, its type and what happens to a damaged
value are decided here once. Nothing raises on damage: a number that does not parse or
is out of its range reads as its default, a time out of the stored range as None, JSON
that does not decode (or holds a number no JSON answer can) as its raw text; each such
field is named in ``JobHash.damaged`` with what was found there.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, overload

from . import validation
from .codec import decode
from .fields import ATTEMPT_LOG_SIZE, FORMAT, logical
from .status import JOB_STATUSES

if TYPE_CHECKING:
    from .core import BrokerCore
    from .keys import QueueKeys

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_D = TypeVar("_D")


def from_ms(value: Any) -> dt.datetime | None:
    """Epoch milliseconds (as Redis returns them) as an aware UTC datetime.

    Raises :class:`~.validation.InvalidTime` (a ``ValueError``) for a value that is not
    a number of milliseconds in the stored range (:data:`~.validation.MAX_TIME_MS`).
    """
    ms = checked_ms(value)
    # Positional (days, seconds, microseconds, milliseconds): cheaper than the keyword.
    return None if ms is None else _EPOCH + dt.timedelta(0, 0, 0, ms)


def checked_ms(value: Any) -> int | None:
    """Epoch milliseconds as stored, as an int: :func:`from_ms` without the datetime
    (None for no time; InvalidTime for what is not one in the stored range)."""
    if value in (None, "", 0, "0"):
        return None
    try:
        ms = int(value)
    except (TypeError, ValueError):
        try:
            ms = int(float(value))
        except (TypeError, ValueError, OverflowError):
            raise validation.InvalidTime(
                f"not a time in milliseconds: {str(value)[:40]!r}") from None
    if not validation.MIN_TIME_MS <= ms <= validation.MAX_TIME_MS:  # the message, only then
        validation.check_time_ms(ms, f"time {ms} ms")
    return ms


def to_ms(value: dt.datetime | None) -> int | None:
    """An aware datetime as epoch milliseconds, exactly (the inverse of :func:`from_ms`)."""
    if value is None:
        return None
    return (value - _EPOCH) // dt.timedelta(milliseconds=1)


def reply_time(value: Any) -> dt.datetime | None:
    """A time a script answered after its write: never raises (the write is done; an
    unreadable time reads as None rather than an error a caller would retry)."""
    # What a script answers: an int in range (every enqueue takes this branch).
    if type(value) is int and validation.MIN_TIME_MS <= value <= validation.MAX_TIME_MS \
            and value:
        return _EPOCH + dt.timedelta(0, 0, 0, value)
    try:
        return from_ms(value)
    except ValueError:
        return None


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: JSON can hold it, no JSON answer can
        raise ValueError(f"number out of range: {text[:40]}")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


#: JSON as every reader of a job can hold it: no NaN, no infinity (made once: a decoder
#: keeps no state between calls).
_STRICT_JSON = json.JSONDecoder(parse_float=_finite, parse_constant=_no_constant)


def strict_json(text: str) -> Any:
    """Decode stored JSON that every reader (a database too) can hold: no NaN, no
    infinity, no number out of a double's range. Raises ValueError (or RecursionError)."""
    try:
        value, end = _STRICT_JSON.raw_decode(text)  # the stored text: no whitespace around
    except ValueError:
        return _STRICT_JSON.decode(text)  # whitespace first, or the error decode() gives
    return value if end == len(text) else _STRICT_JSON.decode(text)


class _Reader:
    """Reads the fields of a stored record, noting each damaged one instead of raising."""

    def __init__(self, data: dict[str, str]) -> None:
        self.data = data
        #: field -> what was found there, for each field that could not be read
        self.damaged: dict[str, str] = {}

    def _note(self, name: str, value: Any) -> None:
        self.damaged[name] = str(value)[:80]

    def time(self, name: str) -> dt.datetime | None:
        value = self.data.get(name)
        try:
            return from_ms(value)
        except ValueError:
            self._note(name, value)
            return None

    def json(self, name: str, default: Any) -> Any:
        """Stored JSON, decoded; a damaged value is kept as its raw text (and noted)."""
        text = self.data.get(name)
        if text is None:
            return default
        try:
            return strict_json(text)
        except (ValueError, RecursionError):
            self._note(name, text)
            return text

    def int(self, name: str, default: int, low: int, high: int) -> int:
        value = self.data.get(name)
        if value is None:
            return default
        try:
            number = int(value)
        except (TypeError, ValueError):
            self._note(name, value)
            return default
        if not low <= number <= high:
            self._note(name, value)
            return default
        return number


def read_times(data: dict[str, Any], *names: str) -> tuple[dict[str, dt.datetime | None],
                                                            dict[str, str]]:
    """The times ``names`` of a stored record (a worker's, say), and the damaged ones."""
    reader = _Reader(data)
    return {name: reader.time(name) for name in names}, reader.damaged


@overload
def to_int(value: Any) -> int: ...
@overload
def to_int(value: Any, default: _D) -> int | _D: ...


def to_int(value: Any, default: Any = 0) -> Any:
    """Stored text as an int, or ``default`` (0) when it is absent or not a number."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def to_float(value: Any) -> float | None:
    """Stored text as a float, or None when it is absent or not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def to_fraction(value: Any) -> float | None:
    """A stored progress fraction, or None when absent, not a number or outside 0..1."""
    fraction = to_float(value)
    return fraction if fraction is not None and 0 <= fraction <= 1 else None


def decode_stored(text: str | None, default: Any) -> Any:
    """Decode stored JSON; a corrupted value is returned as its raw text, not raised."""
    if text is None:
        return default
    try:
        return decode(text)
    except (ValueError, RecursionError):
        return text


@dataclass(slots=True)
class JobHash:
    """A job hash decoded. ``text`` keeps every field's stored text under its logical
    name, for a reader that must look at it (the mirror checks what a database can hold)."""

    text: dict[str, str]
    task: str
    status: str
    args: Any
    kwargs: Any
    priority: int
    run_at: dt.datetime | None
    attempts: int
    max_attempts: int
    result: Any
    error: str | None
    traceback: str | None
    worker: str | None
    enqueued_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    progress: float | None
    progress_message: str
    #: The job's own time limit per attempt, seconds (None: none set on the job).
    timeout: float | None
    #: The ``(queue, id)`` parents it waits (or waited) for, in order (workflows).
    parents: list[tuple[str, str]]
    #: Who asked for its abort or cancel ('' when nobody did).
    aborted_by: str = ""
    #: Fields that could not be read: field -> what was found there.
    damaged: dict[str, str] = field(default_factory=dict)
    #: Its concurrency key (engine/keyed.py), and whether it waits for one of its slots.
    concurrency_key: str | None = None
    waiting_for_slot: bool = False

    @property
    def attempt_log(self) -> list[dict[str, Any]]:
        """The last attempts, oldest first (see :func:`attempt_entries`), the one that
        completed the job included; read when asked for."""
        return attempt_entries(
            with_completed_attempt(decode_stored(self.text.get("attempt_log"), []), self.text))


def with_completed_attempt(log: Any, text: Mapping[str, str]) -> Any:
    """The stored attempt log ``log`` with the entry of the attempt that completed the job
    (``text``: its hash's fields by logical name). That attempt is not written to the log:
    the hash's attempt, worker, start and end are its entry, and leaving it out keeps the
    hash of a job completed at its first attempt within Redis's compact encoding (a
    listpack holds values of up to 64 bytes; one entry is longer). A log an earlier
    release wrote, which ends with that entry, is returned as it is; a log that ends with
    an attempt of the same number that did not complete (a retry by hand starts the count
    again) gets the entry."""
    if text.get("status") != "completed" or not isinstance(log, list):
        return log
    attempt = to_int(text.get("attempts"))
    last = log[-1] if log else None
    if isinstance(last, dict) and last.get("n") == attempt and last.get("o") == "completed":
        return log
    entry = {"n": attempt, "w": text.get("worker") or "",
             "b": to_int(text.get("started_at")), "f": to_int(text.get("finished_at")),
             "o": "completed"}
    return [*log[max(0, len(log) + 1 - ATTEMPT_LOG_SIZE):], entry]


def attempt_entries(entries: Any) -> list[dict[str, Any]]:
    """Attempt log entries (their stored short keys) as dicts with ``attempt``,
    ``worker``, ``started_at``, ``finished_at`` (aware datetimes), ``outcome``, ``error``
    and ``traceback`` (the end of a failed attempt's); what is not an entry the worker
    writes is skipped, never raised on."""
    log: list[dict[str, Any]] = []
    for entry in entries if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        log.append({
            "attempt": to_int(entry.get("n")),
            "worker": str(entry.get("w") or ""),
            "started_at": _entry_time(entry.get("b")),
            "finished_at": _entry_time(entry.get("f")),
            "outcome": str(entry.get("o") or ""),
            "error": str(entry.get("x") or ""),
            "traceback": str(entry.get("t") or ""),
        })
    return log


def parse_parents(raw: str | None) -> list[tuple[str, str]]:
    """The stored parents (field ``d``, JSON ``[[queue, id], ...]``) as pairs; what is
    not such a pair is skipped, never raised on."""
    value = decode_stored(raw, [])
    if not isinstance(value, list):
        return []
    return [(str(p[0]), str(p[1])) for p in value if isinstance(p, list) and len(p) == 2]


def _entry_time(value: Any) -> dt.datetime | None:
    """A time of an attempt log entry; None when absent or out of range."""
    try:
        return from_ms(to_int(value) or None)
    except ValueError:
        return None


def read_job_hash(stored: dict[str, str]) -> JobHash:
    """Decode a job hash as HGETALL returns it (stored field names)."""
    data = logical(stored)
    read = _Reader(data)
    task, status = data.get("task", ""), data.get("status", "")
    if not task:
        read.damaged["task"] = "(missing)"
    if status not in JOB_STATUSES:
        read.damaged["status"] = status[:80] or "(missing)"
    if to_int(data.get("format", "1")) > FORMAT:
        read.damaged["format"] = f"{data['format'][:20]} (this version reads {FORMAT})"
    return JobHash(
        text=data,
        task=task,
        status=status,
        args=read.json("args", []),
        kwargs=read.json("kwargs", {}),
        priority=read.int("priority", 0, validation.MIN_PRIORITY, validation.MAX_PRIORITY),
        run_at=read.time("run_at"),
        attempts=read.int("attempts", 0, 0, 2**31 - 1),
        # a manual retry adds the attempts used to the enqueued bound (retry.lua)
        max_attempts=read.int("max_attempts", 1, 1, 2**31 - 1),
        result=read.json("result", None),
        error=data.get("error"),
        traceback=data.get("traceback"),
        worker=data.get("worker"),
        progress=to_fraction(data.get("progress")),
        progress_message=data.get("progress_message", ""),
        enqueued_at=read.time("enqueued_at"),
        started_at=read.time("started_at"),
        finished_at=read.time("finished_at"),
        damaged=read.damaged,
        timeout=to_int(data.get("timeout")) / 1000
        if to_int(data.get("timeout")) > 0 else None,
        parents=parse_parents(data.get("parents")),
        concurrency_key=data.get("concurrency_key"),
        waiting_for_slot=data.get("waiting_for_slot") == "1",

        aborted_by=data.get("aborted_by", ""),
    )


#: Job hashes read per round trip (:func:`read_job_fields`).
READ_CHUNK = 5_000


def read_job_fields(broker: BrokerCore, keys: QueueKeys, job_ids: Sequence[str],
                    names: Sequence[str]) -> dict[str, JobHash]:
    """The stored fields ``names`` of each job of ``job_ids`` in the shard ``keys``,
    decoded (a damaged field reads as its default); a job whose hash is gone is left
    out."""
    found: dict[str, JobHash] = {}
    for start in range(0, len(job_ids), READ_CHUNK):
        part = job_ids[start:start + READ_CHUNK]
        with broker.read_errors():
            pipe = broker.client.pipeline(transaction=False)
            for job_id in part:
                pipe.hmget(keys.job(job_id), *names)
            replies = pipe.execute()
        for job_id, values in zip(part, replies, strict=True):
            fields = {name: v for name, v in zip(names, values, strict=True) if v is not None}
            if fields:
                found[job_id] = read_job_hash(fields)
    return found
