"""Events of the queues' streams, decoded, and the Job rows they make (for the mirror).

A row is built from the job HASH when it still exists (the newest state), else updated
from the events alone (:func:`apply_event`).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass

from .engine.job import _decode_or_raw, from_ms
from .engine.keys import STATUSES, QueueKeys
from .models import Job, JobStatus

logger = logging.getLogger("django_delayq.mirror")


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
    """Decode a stream entry; None (after a warning) when it is garbled or trimmed."""
    if fields is None:
        logger.warning("event trimmed from the stream before it was mirrored stream=%s id=%s",
                       keys.events, entry_id)
        return None
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
