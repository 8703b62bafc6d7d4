"""Events of the queues' streams, decoded, and the Job rows they make (for the mirror).

A row is built from the job HASH when it still exists (the newest state), else updated
from the events alone (:func:`apply_event`).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from ..engine.fields import stored
from ..engine.jobhash import (
    from_ms,
    read_job_hash,
    strict_json,
    to_fraction,
    with_completed_attempt,
)
from ..engine.logfields import log
from ..engine.status import JOB_STATUSES, Status
from ..models import JobStatus
from ..runtime.consumer import Event
from .table import Row, StoredJSON

logger = logging.getLogger("django_delayq.mirror")

#: Escapes in stored JSON of what PostgreSQL cannot hold: NUL and (possibly unpaired)
#: surrogates. The job data is ASCII JSON, so a scan of the text finds them cheaply.
_UNSTORABLE_ESCAPE = re.compile(r"\\u(?:0000|d[89a-f][0-9a-f]{2})", re.IGNORECASE)


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


def _json_value(value: Any, raw: str | None, damaged: bool) -> Any:
    """What to write of a JSON field, read as ``value`` from its stored text ``raw``: that
    text itself when a database takes it as it is (the common case: the decoder checked
    it, and it is ASCII with no escape a database refuses), else the value made storable
    (a damaged field's value is its text, written as a JSON string). None is SQL NULL."""
    if value is None or raw is None:
        return value
    if "\x00" in raw or not raw.isascii() or _UNSTORABLE_ESCAPE.search(raw):
        return _storable(value)
    return value if damaged else StoredJSON(raw, value)


def row_from_hash(queue: str, job_id: str, data: dict[str, str]) -> Row:
    """The row values of a job HASH's state (HGETALL's answer, stored names).

    A damaged field (a time out of range, a number that is not one) takes its default,
    so one damaged hash cannot stall the mirror; ``damaged`` names each such field and
    what was found there, as the live ``Job`` does.
    """
    h = read_job_hash(data)
    text, damaged = h.text, h.damaged
    parents = [list(ref) for ref in h.parents]
    return {
        "queue": queue, "job_id": job_id, "task_name": storable_text(h.task[:200]),
        "status": h.status if h.status in JOB_STATUSES else JobStatus.READY,
        "priority": h.priority,
        "args": _json_value(h.args, text.get("args"), "args" in damaged),
        "kwargs": _json_value(h.kwargs, text.get("kwargs"), "kwargs" in damaged),
        "run_at": h.run_at, "enqueued_at": h.enqueued_at,
        "started_at": h.started_at, "finished_at": h.finished_at,
        "attempts": max(0, h.attempts), "max_attempts": max(1, h.max_attempts),
        "worker": storable_text((h.worker or "")[:200]),
        "result": _json_value(h.result, text.get("result"), "result" in damaged),
        "error": storable_text(h.error or ""),
        "traceback": storable_text(h.traceback or ""),
        "progress": h.progress,
        "progress_message": storable_text(h.progress_message[:500]),
        "attempt_log": _attempt_log(text),
        # Only the well-formed pairs are kept: never the stored text as it is.
        "parents": _storable(parents) if parents else parents,
        "damaged": {storable_text(k): storable_text(v) for k, v in damaged.items()} or None,
        "aborted_by": storable_text(h.aborted_by[:200]),
    }


def _attempt_log(text: dict[str, str]) -> list[Any] | StoredJSON:
    """The attempt log as the model keeps it (a list; [] when unreadable), with the
    attempt that completed the job (:func:`with_completed_attempt`)."""
    raw = text.get("attempt_log")
    try:
        value = [] if raw is None else strict_json(raw)
    except (ValueError, RecursionError):
        return []
    if not isinstance(value, list):
        return []
    log = with_completed_attempt(value, text)
    return _json_value(value, raw, False) if log is value and raw is not None else _storable(log)


def apply_event(row: Row, event: Event) -> None:
    """Update ``row`` (its values by field name) from an event alone (its job HASH is
    gone)."""
    f, at = event.fields, event.at
    attempt = event.attempt
    if attempt and attempt.isdecimal():
        row["attempts"] = int(attempt)
    kind = event.event
    if kind == "enqueued":
        row["status"] = row["status"] or JobStatus.READY
        row["enqueued_at"] = row["enqueued_at"] or at
    elif kind == "claimed":
        row.update(status=JobStatus.CLAIMED, started_at=None, finished_at=None,
                   worker=storable_text((f.get("worker") or row["worker"])[:200]))
    elif kind == "started":
        row.update(status=JobStatus.ACTIVE, started_at=at, finished_at=None,
                   worker=storable_text((f.get("worker") or row["worker"])[:200]))
    elif kind == "completed":
        row.update(status=JobStatus.COMPLETED, finished_at=at)
    elif kind == "failed":
        row.update(status=JobStatus.FAILED, finished_at=at,
                   error=storable_text(f["error"] if "error" in f else row["error"]))
    elif kind == "cancelled":
        row.update(status=JobStatus.CANCELLED, finished_at=at)
    elif kind in ("retried", "rescheduled"):
        run_at = from_ms(f.get("run_at"))
        due = run_at is None or (at is not None and run_at <= at)
        row.update(run_at=run_at or row["run_at"], finished_at=None,
                   status=JobStatus.READY if due else JobStatus.SCHEDULED)
        if f.get("manual"):  # attempts go on, with a new budget (retry.lua)
            row.update(error="", traceback="")
            if f.get("max_attempts", "").isdecimal():
                row["max_attempts"] = int(f["max_attempts"])
            else:  # a retry of 0.1.0, which started the count again
                row["attempts"] = 0
    elif kind == "progress":  # the event carries the hash's fields, by their stored names
        row["progress"] = to_fraction(f.get(stored("progress")))
        row["progress_message"] = storable_text(f.get(stored("progress_message"), "")[:500])
    elif kind in ("promoted", "reclaimed", "released"):
        row["status"] = JobStatus.READY
    elif kind == "unblocked":  # its last parent ended (workflows): due now or later
        scheduled = f.get("status") == Status.SCHEDULED
        row["status"] = JobStatus.SCHEDULED if scheduled else JobStatus.READY
    elif kind == "aborting":  # asked to stop; its attempt's end says how it ended
        pass
    elif kind in ("purged", "orphaned"):
        row["status"] = JobStatus.PURGED
        row["finished_at"] = row["finished_at"] or at
    else:
        log(logger, logging.WARNING, "unknown event kind, keeping status", event=kind,
            job=event.job_id)

