"""An events stream's entry decoded into its events, one per job it names: what every
sink of the stream consumer (the mirror's rows, the lake's files) reads an entry as.

An entry that cannot be decoded (garbled, a job id no job can have, a time out of the
stored range, a format newer than this version reads) is skipped by whichever sink reads
it, with the same reason, so the two never disagree about which entries exist.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..engine.fields import FORMAT
from ..engine.jobhash import checked_ms, from_ms
from ..engine.keys import QueueKeys, split_job_ids, validate_job_id

logger = logging.getLogger("django_delayq.mirror")

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
    may give each its attempt in ``attempts``, in the same order. Empty, after a warning,
    when the entry is garbled (``on_garbled`` is then given the reason) or trimmed.
    """
    if fields is None:
        logger.warning("event trimmed from the stream before it was mirrored stream=%s id=%s",
                       keys.events, entry_id)
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
        logger.warning("skipping garbled event stream=%s id=%s fields=%r error=%s",
                       keys.events, entry_id, fields, exc)
        if on_garbled is not None:
            on_garbled(f"garbled event: {type(exc).__name__}: {exc}")
        return []
    return [Event(entry_id, order, event, job_id, attempt, fields)
            for job_id, attempt in zip(job_ids, attempts, strict=True)]
