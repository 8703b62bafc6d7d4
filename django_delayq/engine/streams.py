"""Reading a queue shard's events stream through a consumer group.

The model mirror and the lake exporter read every queue's events this way: a group of
their own per stream, reads that survive the group being deleted under them (FLUSHDB, a
Redis restarted without persistence), acknowledgements, and taking over what another
consumer left pending. Two ways to take over:

- :func:`take_over_idle` (the mirror): any entries idle for long enough, however they
  were read; right where applying an entry twice is harmless.
- batches (the lake exporter): :func:`read_batch` records the ids it read as the
  consumer's batch in progress, in the same script; :func:`claim_batch` moves a whole
  batch, or nothing, to another consumer once every entry of it has been idle long
  enough; :func:`ack_batch` ends it. Whoever finishes a batch finishes exactly the
  entries it was read with, so two consumers racing over one batch (a slow one, and the
  one that took it over) produce the same output, and the second replaces the first.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .commands import Commands
from .errors import DelayQError
from .keys import QueueKeys
from .queue import SKIPS_KEPT, Queue

if TYPE_CHECKING:
    from .broker import Broker

#: One stream entry: its id and fields (None: the entry was trimmed from the stream).
Entry = tuple[str, "dict[str, str] | None"]
#: Entries acknowledged per XACK.
ACK_SLICE = 10_000


class GroupGone(DelayQError):
    """The consumer group (or its stream) no longer exists: create it again."""


class BatchInProgress(DelayQError):
    """The consumer has a batch in progress: finish it (:func:`claim_batch` takes it
    back) before reading another."""


def _missing(exc: ResponseError) -> bool:
    return "NOGROUP" in str(exc)


def shards_to_read(broker: Broker, queues: Sequence[str] | None) -> list[QueueKeys]:
    """The queue shards whose streams a reader follows: those of ``queues``, or of every
    queue seen (``Queue.all``) when it names none."""
    names = list(queues) if queues else [q.name for q in Queue.all(broker=broker)]
    return [keys for name in names for keys in broker.shards(name)]


def ensure_group(client: Any, stream: str, group: str, *, entries_read: int | None = None
                 ) -> None:
    """Create ``group`` on ``stream`` (and the stream), reading from its first entry,
    unless it exists. ``entries_read`` tells Redis how many entries the group counts as
    read already (those trimmed before it began), so its lag starts right."""
    try:
        if entries_read:
            client.xgroup_create(stream, group, id="0", entries_read=entries_read)
        else:
            client.xgroup_create(stream, group, id="0", mkstream=True)
    except ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def read(client: Any, group: str, consumer: str, streams: Mapping[str, str], count: int,
         block: int | None = None) -> list[tuple[str, list[Entry]]]:
    """XREADGROUP: per stream, its entries (``">"``: new ones; ``"0"``: this consumer's
    pending ones). Raises :class:`GroupGone` if a group is missing."""
    try:
        reply = client.xreadgroup(group, consumer, dict(streams), count=count,
                                  block=block) or []
    except ResponseError as exc:
        if _missing(exc):
            raise GroupGone(str(exc)) from None
        raise
    return [(stream, list(entries)) for stream, entries in reply]


def take_over_idle(client: Any, stream: str, group: str, consumer: str, min_idle_ms: int,
                   count: int) -> tuple[list[Entry], list[str]]:
    """Claim for ``consumer`` up to ``count`` entries of any consumer idle for
    ``min_idle_ms``: the entries, and the ids of those trimmed from the stream meanwhile
    (acknowledged here: nothing is left to read of them)."""
    reply = client.xautoclaim(stream, group, consumer, min_idle_ms, start_id="0-0",
                              count=count)
    entries = [e for e in reply[1] if e is not None] if len(reply) > 1 else []
    deleted = list(reply[2]) if len(reply) > 2 else []
    if deleted:
        ack(client, stream, group, deleted)
    return entries, deleted


def ack(client: Any, stream: str, group: str, ids: Sequence[str]) -> None:
    """Acknowledge ``ids`` (what a crash may fall before: call it once their effect is
    durable)."""
    for start in range(0, len(ids), ACK_SLICE):
        client.xack(stream, group, *ids[start:start + ACK_SLICE])


def record_skip(client: Any, keys: QueueKeys, reader: str, entry_id: str, reason: str) -> str:
    """Keep an entry that ``reader`` ('mirror', 'lake export') skipped as unusable where
    operators see it: the shard's count and its newest reasons (``Queue.skipped_events()``:
    the dashboard, the API). Returns the reason as kept (one line)."""
    reason = reason.replace("\n", " ")[:300]
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    pipe = client.pipeline(transaction=False)
    pipe.incr(keys.skipped)
    pipe.lpush(keys.skipped_log, f"{when} {reader} id={entry_id} {reason}")
    pipe.ltrim(keys.skipped_log, 0, SKIPS_KEPT - 1)
    pipe.execute()
    return reason


def pending_consumers(client: Any, stream: str, group: str) -> list[str]:
    """The consumers of ``group`` that have entries pending."""
    try:
        return [c["name"] for c in client.xinfo_consumers(stream, group) if c["pending"]]
    except ResponseError as exc:
        if _missing(exc):
            raise GroupGone(str(exc)) from None
        raise


# -- batches ----------------------------------------------------------------------------


@dataclass(slots=True)
class StreamBatch:
    """A consumer's batch in progress: the ids it was read with, and its entries."""

    first: str
    last: str
    entries: list[Entry]
    #: Entries of the batch trimmed from the stream before it was taken over.
    deleted: list[str] = field(default_factory=list)

    @property
    def record(self) -> str:
        return f"{self.first} {self.last}"

    @property
    def ids(self) -> list[str]:
        return [entry_id for entry_id, _ in self.entries]


def _entries(raw: Sequence[Any]) -> list[Entry]:
    """Entries as a script returns them (``{id, {field, value, ...}}``)."""
    out: list[Entry] = []
    for entry_id, flat in raw:
        out.append((entry_id, dict(zip(flat[0::2], flat[1::2], strict=True))
                    if flat else None))
    return out


def _script(call: Any) -> list[Any]:
    try:
        return list(call())
    except ResponseError as exc:
        if _missing(exc):
            raise GroupGone(str(exc)) from None
        raise


def read_batch(commands: Commands, keys: QueueKeys, group: str, consumer: str,
               count: int) -> StreamBatch | None:
    """Read up to ``count`` new entries as ``consumer``'s batch (None when there are
    none). Raises :class:`BatchInProgress` if the consumer has a batch in progress."""
    reply = _script(lambda: commands.batch_read(keys, group, consumer, count))
    if reply[0] == "busy":
        raise BatchInProgress(f"consumer {consumer!r} has a batch in progress on "
                              f"{keys.events}")
    entries = _entries(reply[1:])
    if not entries:
        return None
    return StreamBatch(entries[0][0], entries[-1][0], entries)


def claim_batch(commands: Commands, keys: QueueKeys, group: str, owner: str, taker: str,
                min_idle_ms: int, count: int) -> StreamBatch | None:
    """Move ``owner``'s batch in progress to ``taker`` (``owner`` itself: take back its
    own), whole, if every entry of it has been idle for ``min_idle_ms``; None when there
    is nothing to take (or the owner is still at it, or the taker has a batch of its
    own). A consumer with pending entries and no batch recorded gives up to ``count``."""
    reply = _script(lambda: commands.batch_claim(keys, group, owner, taker, min_idle_ms,
                                                 count))
    if reply[0] != "ok":
        return None
    _, first, last, deleted, *raw = reply
    return StreamBatch(first, last, _entries(raw), deleted.split() if deleted else [])


def ack_batch(commands: Commands, keys: QueueKeys, group: str, consumer: str,
              batch: StreamBatch) -> int:
    """End ``batch``: acknowledge its entries and forget it (if it is still
    ``consumer``'s). Returns how many entries were pending until now."""
    return commands.batch_ack(keys, group, consumer, batch.record, batch.ids)
