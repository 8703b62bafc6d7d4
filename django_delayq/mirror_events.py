"""Events of the queues' streams, decoded, and the Job rows they make (for the mirror).

A row is built from the job HASH when it still exists (the newest state), else updated
from the events alone (:func:`apply_event`).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import dataclass
from typing import Any

from .engine.fields import logical
from .engine.job import _decode_or_raw, from_ms
from .engine.keys import STATUSES, QueueKeys, validate_job_id
from .models import Job, JobStatus

logger = logging.getLogger("django_delayq.mirror")

#: Escapes in stored JSON of what PostgreSQL cannot hold: NUL and (possibly unpaired)
#: surrogates. The job data is ASCII JSON, so a scan of the text finds them cheaply.
_UNSTORABLE_ESCAPE = re.compile(r"\\u(?:0000|d[89a-f][0-9a-f]{2})", re.IGNORECASE)


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


def parse_entry(keys: QueueKeys, entry_id: str, fields: dict[str, str] | None) -> list[Event]:
    """Decode a stream entry into its events: one per job it names.

    An entry for several jobs (a bulk enqueue, a claim, an ack) names them in ``jobs`` and
    may give each its attempt in ``attempts``, in the same order. Empty, after a warning,
    when the entry is garbled or trimmed.
    """
    if fields is None:
        logger.warning("event trimmed from the stream before it was mirrored stream=%s id=%s",
                       keys.events, entry_id)
        return []
    try:
        stream_id(entry_id)
        event = fields["event"]
        attempts: list[str | None]
        if "jobs" not in fields:
            job_ids, attempts = [fields["job"]], [fields.get("attempt")]
        else:
            job_ids = fields["jobs"].split(" ")
            if "attempts" in fields:
                attempts = list(fields["attempts"].split(" "))
            else:
                attempts = [None] * len(job_ids)
            if len(attempts) != len(job_ids):
                raise ValueError("jobs and attempts differ in length")
        int(fields.get("ts", "0"))
        if not event or not all(job_ids):
            raise ValueError("empty event or job")
        # An id no job can have would fail its row's insert (PostgreSQL enforces the
        # column length): a poison entry that would stall the stream.
        for job_id in job_ids:
            validate_job_id(job_id)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        logger.warning("skipping garbled event stream=%s id=%s fields=%r error=%s",
                       keys.events, entry_id, fields, exc)
        return []
    common = {k: v for k, v in fields.items() if k not in ("jobs", "attempts", "attempt")}
    return [Event(keys, entry_id, event, job_id,
                  common if attempt is None else {**common, "attempt": attempt})
            for job_id, attempt in zip(job_ids, attempts, strict=True)]


def storable_text(text: str) -> str:
    """``text`` with what a database cannot store (NUL, unpaired surrogates) as U+FFFD.

    Redis holds any string a task was given or raised; the mirror must be able to write
    every row, or one job would stall its stream (PostgreSQL refuses both).
    """
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join("\ufffd" if "\ud800" <= ch <= "\udfff" else ch for ch in text)
    return text


def _storable(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, list):
        return [_storable(v) for v in value]
    if isinstance(value, dict):
        return {storable_text(str(k)): _storable(v) for k, v in value.items()}
    return value


def _json_field(raw: str | None, default: Any) -> Any:
    value = _decode_or_raw(raw, default)
    if raw and ("\x00" in raw or _UNSTORABLE_ESCAPE.search(raw) or not raw.isascii()):
        value = _storable(value)
    return value


def row_from_hash(queue: str, job_id: str, stored: dict[str, str]) -> Job:
    """A model instance holding a job HASH's state (HGETALL's answer, stored names)."""
    data = logical(stored)

    def num(name: str, default: int) -> int:
        try:
            return int(data.get(name, default))
        except (TypeError, ValueError):
            return default

    status = data.get("status", "")
    return Job(
        queue=queue, job_id=job_id, task_name=storable_text(data.get("task", "")[:200]),
        status=status if status in STATUSES else JobStatus.READY,
        priority=num("priority", 0),
        args=_json_field(data.get("args"), []), kwargs=_json_field(data.get("kwargs"), {}),
        run_at=from_ms(data.get("run_at")), enqueued_at=from_ms(data.get("enqueued_at")),
        started_at=from_ms(data.get("started_at")), finished_at=from_ms(data.get("finished_at")),
        attempts=max(0, num("attempts", 0)), max_attempts=max(1, num("max_attempts", 1)),
        worker=storable_text((data.get("worker") or "")[:200]),
        result=_json_field(data.get("result"), None),
        error=storable_text(data.get("error") or ""),
        traceback=storable_text(data.get("traceback") or ""),
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
        row.worker = storable_text((f.get("worker") or row.worker)[:200])
    elif kind == "completed":
        row.status, row.finished_at = JobStatus.COMPLETED, at
    elif kind == "failed":
        row.status, row.finished_at = JobStatus.FAILED, at
        row.error = storable_text(f.get("error", row.error))
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
    elif kind in ("promoted", "reclaimed", "released"):
        row.status = JobStatus.READY
    elif kind in ("purged", "orphaned"):
        row.status = JobStatus.PURGED
        row.finished_at = row.finished_at or at
    else:
        logger.warning("unknown event kind, keeping status event=%s job=%s", kind, event.job_id)
