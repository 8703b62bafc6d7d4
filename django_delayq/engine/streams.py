"""Reading the queue shards' events streams through consumer groups, in batches.

Every reader (the model mirror, the lake exporter: ``runtime/consumer.py``) reads this
way, a group of its own per stream:

- :func:`read_batches` reads each shard's new entries as the consumer's *batch in
  progress*, recording their range in the same script (``lua/batch_read.lua``), for
  every shard in one round trip;
- :func:`claim_batch` moves a whole batch, or nothing, to another consumer once every
  entry of it has been idle long enough (the consumer itself takes back its own at
  once): the one way a consumer's pending entries change hands, so two consumers racing
  over a batch (a slow one, and the one that took it over) do the same work twice,
  never half of it each;
- :func:`ack_batch` ends a batch once its work is durable.

Reads survive the group being deleted under them (FLUSHDB, a Redis restarted without
persistence): :class:`GroupGone` says to create it again. Every Redis error comes out as
the engine's own (:meth:`BrokerCore.read_errors`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from .errors import DelayQError
from .keys import QueueKeys
from .markers import WAKE_TTL_MS
from .overview import SKIPS_KEPT
from .queue import Queue

if TYPE_CHECKING:
    from .broker import Broker
    from .core import BrokerCore

#: One stream entry: its id and fields (None: the entry was trimmed from the stream).
Entry = tuple[str, "dict[str, str] | None"]
#: A stream's id before any entry.
START = "0-0"


class GroupGone(DelayQError):
    """The consumer group (or its stream) no longer exists: create it again."""


class BatchInProgress(DelayQError):
    """The consumer has a batch in progress: finish it (:func:`claim_batch` takes it
    back) before reading another."""


def _missing(exc: BaseException) -> bool:
    return "NOGROUP" in str(exc) or "no such key" in str(exc)


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


def shards_to_read(broker: Broker, queues: Sequence[str] | None) -> list[QueueKeys]:
    """The queue shards whose streams a reader follows: those of ``queues``, or of every
    queue seen (``Queue.all``) when it names none."""
    names = list(queues) if queues else [q.name for q in Queue.all(broker=broker)]
    return [keys for name in names for keys in broker.shards(name)]


def ensure_group(broker: BrokerCore, keys: QueueKeys, group: str) -> None:
    """Create ``group`` on the shard's stream (and the stream), reading from its first
    entry, unless it exists. It counts the entries trimmed before it began as read, so
    that what it loses later (:func:`unread_trimmed`) starts at 0."""
    client = broker.client
    with broker.read_errors():
        try:
            info = client.xinfo_stream(keys.events)
            before = int(info["entries-added"]) - int(info["length"])
        except (ResponseError, KeyError, TypeError):
            before = 0  # no stream yet (or a Redis before 7.0, which has no such count)
        try:
            if before:
                client.xgroup_create(keys.events, group, id="0", entries_read=before)
            else:
                client.xgroup_create(keys.events, group, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise


def unread_trimmed(broker: BrokerCore, keys: QueueKeys, group: str) -> int | None:
    """How many entries the stream's cap trimmed before ``group`` read them (None: the
    Redis or the group cannot tell)."""
    client = broker.client
    with broker.read_errors():
        try:
            info = client.xinfo_stream(keys.events)
            found = [g for g in client.xinfo_groups(keys.events) if g.get("name") == group]
        except ResponseError:
            return None
    read = found[0].get("entries-read") if found else None
    if read is None or info.get("entries-added") is None:
        return None
    return max(0, int(info["entries-added"]) - int(info["length"]) - int(read))


def read_batches(broker: BrokerCore, shards: Sequence[QueueKeys], group: str,
                 consumer: str, count: int
                 ) -> list[tuple[QueueKeys, StreamBatch | None, str]]:
    """Per shard, up to ``count`` new entries as ``consumer``'s batch (None: none), and
    the id of the stream's newest entry, all in one round trip. Raises
    :class:`BatchInProgress` if the consumer has a batch in progress on one of them (the
    others' batches are then read: take that one back first), :class:`GroupGone` if a
    group is missing."""
    batch = broker.batch()
    for keys in shards:
        broker.commands.add_batch_read(batch, keys, group, consumer, count)
    with broker.read_errors():
        replies = batch.run(raise_on_error=False)
    out: list[tuple[QueueKeys, StreamBatch | None, str]] = []
    busy = None
    for keys, reply in zip(shards, replies, strict=True):
        if isinstance(reply, BaseException):
            if _missing(reply):
                raise GroupGone(str(reply)) from reply
            with broker.read_errors():
                raise reply
        if reply[0] == "busy":
            busy = keys
            continue
        entries = _entries(reply[2:])
        out.append((keys, StreamBatch(entries[0][0], entries[-1][0], entries)
                    if entries else None, str(reply[1])))
    if busy is not None:
        raise BatchInProgress(f"consumer {consumer!r} has a batch in progress on "
                              f"{busy.events}")
    return out


def claim_batch(broker: BrokerCore, keys: QueueKeys, group: str, owner: str, taker: str,
                min_idle_ms: int, count: int) -> StreamBatch | None:
    """Move ``owner``'s batch in progress to ``taker`` (``owner`` itself: take back its
    own), whole, if every entry of it has been idle for ``min_idle_ms``; None when there
    is nothing to take (or the owner is still at it, or the taker has a batch of its
    own). A consumer with pending entries and no batch recorded gives up to ``count``."""
    reply = list(_call(broker, lambda: broker.commands.batch_claim(
        keys, group, owner, taker, min_idle_ms, count)))
    if reply[0] != "ok":
        return None
    _, first, last, deleted, *raw = reply
    return StreamBatch(first, last, _entries(raw), deleted.split() if deleted else [])


def ack_batch(broker: BrokerCore, keys: QueueKeys, group: str, consumer: str,
              batch: StreamBatch) -> int:
    """End ``batch``: acknowledge its entries and forget it (if it is still
    ``consumer``'s). Returns how many entries were pending until now."""
    return int(_call(broker, lambda: broker.commands.batch_ack(
        keys, group, consumer, batch.record, batch.ids)))


def pending_consumers(broker: BrokerCore, keys: QueueKeys, group: str) -> list[str]:
    """The consumers of ``group`` that have entries pending."""
    with broker.read_errors():
        try:
            return [c["name"] for c in broker.client.xinfo_consumers(keys.events, group)
                    if c["pending"]]
        except ResponseError as exc:
            if _missing(exc):
                raise GroupGone(str(exc)) from None
            raise


def forget_idle_consumers(broker: BrokerCore, keys: QueueKeys, group: str, keep: str,
                          idle_ms: int) -> None:
    """Remove the consumers of ``group`` (but ``keep``) with nothing pending, idle for
    ``idle_ms``: a group remembers every consumer that ever read otherwise."""
    client = broker.client
    with broker.read_errors():
        try:
            consumers = client.xinfo_consumers(keys.events, group)
        except ResponseError as exc:
            if _missing(exc):
                return
            raise
        for consumer in consumers:
            if (consumer["name"] != keep and not consumer["pending"]
                    and consumer["idle"] > idle_ms):
                client.xgroup_delconsumer(keys.events, group, consumer["name"])


def wait_for_entries(broker: BrokerCore, tails: Mapping[str, str], block_ms: int,
                     wake: str | None = None) -> bool:
    """Block (at most ``block_ms``) until a stream of ``tails`` (stream -> the id of the
    last entry read), or the stream ``wake`` (:func:`wake_reader`), has an entry after
    it. Returns False at once on a Cluster whose streams live in several slots (one
    blocking read cannot name them): the caller waits its own way."""
    if broker.is_cluster and len({stream.partition("}")[0] for stream in tails}) > 1:
        return False
    watched = dict(tails)
    if wake is not None:
        watched[wake] = "0-0"  # a wake that came before this read counts too
    with broker.read_errors():
        reply = broker.client.xread(watched, count=1, block=max(1, block_ms))
        if wake is not None and any(name in (wake, wake.encode()) for name, _ in reply or ()):
            broker.client.delete(wake)  # taken: it wakes one wait
    return True


def wake_reader(broker: BrokerCore, key: str) -> None:
    """End a :func:`wait_for_entries` that watches the stream ``key`` now."""
    with broker.connection_errors():
        pipe = broker.client.pipeline(transaction=False)
        pipe.xadd(key, {"wake": 1}, maxlen=1)
        pipe.pexpire(key, WAKE_TTL_MS)
        pipe.execute()


def record_skip(broker: BrokerCore, keys: QueueKeys, reader: str, entry_id: str,
                reason: str) -> str:
    """Keep an entry that ``reader`` ('mirror', 'lake export') skipped as unusable where
    operators see it: the shard's count and its newest reasons (``Queue.skipped_events()``:
    the dashboard, the API). Returns the reason as kept (one line)."""
    reason = reason.replace("\n", " ")[:300]
    when = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    with broker.read_errors():
        pipe = broker.client.pipeline(transaction=False)
        pipe.incr(keys.skipped)
        pipe.lpush(keys.skipped_log, f"{when} {reader} id={entry_id} {reason}")
        pipe.ltrim(keys.skipped_log, 0, SKIPS_KEPT - 1)
        pipe.execute()
    return reason


def _entries(raw: Sequence[Any]) -> list[Entry]:
    """Entries as a script returns them (``{id, {field, value, ...}}``)."""
    return [(entry_id, dict(zip(flat[0::2], flat[1::2], strict=True)) if flat else None)
            for entry_id, flat in raw]


def _call(broker: BrokerCore, call: Callable[[], Any]) -> Any:
    """``call()``, a missing group raised as :class:`GroupGone`, other Redis errors as
    the engine's."""
    with broker.read_errors():
        try:
            return call()
        except ResponseError as exc:
            if _missing(exc):
                raise GroupGone(str(exc)) from None
            raise
