"""What a consumer group still has to apply of queues' events streams (the mirror's lag).

Per shard: the entries delivered to the group and not acknowledged (its pending
entries), plus the entries after the last one delivered to it. Both are read from the
stream and the group themselves, never from the counters behind ``XINFO GROUPS``'s
``lag`` (the group's ``entries-read``, the stream's ``entries-added``): each node keeps
those on its own, and after a failover they can differ by a fixed amount for ever (a lag
of thousands with the group caught up). A group whose last delivered id is the stream's
last entry, with nothing pending, reads 0.

The entries after the last delivered id are counted (``XRANGE``) up to :data:`COUNT_CAP`
per shard, so a read costs the same whatever the backlog; past it, :attr:`Backlog.capped`
says the figure is a lower bound. No count is needed when every entry is after the
group's position (a stream without the group, a position trimmed away: ``XLEN``) or
none is (caught up).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from .core import BrokerCore
from .keys import QueueKeys

#: Entries counted after a group's position, per shard and read.
COUNT_CAP = 1_000


@dataclass(slots=True)
class Backlog:
    """What a consumer group still has to apply of a queue's streams (its shards summed)."""

    #: Entries delivered to the group's consumers and not acknowledged.
    pending: int = 0
    #: Entries after the last one delivered to the group (at most the cap per shard).
    unread: int = 0
    #: Whether a shard had more unread entries than the cap: ``events`` is a lower bound.
    capped: bool = False
    #: Ms since the group's most recently active consumer last read (None: no consumer,
    #: or not asked).
    idle_ms: int | None = None

    @property
    def events(self) -> int:
        """Entries the group still has to apply."""
        return self.pending + self.unread

    def add(self, other: Backlog) -> None:
        """Add another shard's (or queue's) backlog to this one."""
        self.pending += other.pending
        self.unread += other.unread
        self.capped = self.capped or other.capped
        if other.idle_ms is not None:
            self.idle_ms = (other.idle_ms if self.idle_ms is None
                            else min(self.idle_ms, other.idle_ms))


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _absent(reply: Any) -> bool:
    """Whether an ``XINFO`` reply is the error of a stream or group that does not exist
    (not a refusal: no permission, a key of another type...)."""
    return isinstance(reply, ResponseError) and str(reply).startswith(("no such key",
                                                                       "NOGROUP"))


def _raised(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise reply
    return reply


def _shard(stream: Any, groups: Any, consumers: Any, group: str) -> tuple[Backlog, str | None]:
    """A shard's backlog from its ``XINFO STREAM``, ``XINFO GROUPS`` and ``XINFO
    CONSUMERS`` replies (None: not asked), and the id after which its unread entries must
    be counted (None: they are known already)."""
    if _absent(stream):
        return Backlog(), None  # no event yet
    stream, groups = _raised(stream), _raised(groups)
    length = int(stream["length"])
    found = next((g for g in groups if g.get("name") == group), None)
    if found is None:
        return Backlog(unread=length), None  # the group will read the stream from its start
    backlog = Backlog(pending=int(found.get("pending") or 0))
    if consumers is not None and not _absent(consumers):
        idle = [int(c.get("idle", 0)) for c in _raised(consumers)]
        backlog.idle_ms = min(idle) if idle else None
    first, last = stream.get("first-entry"), stream.get("last-entry")
    position = _id(found["last-delivered-id"])
    if not length or first is None or last is None or position >= _id(last[0]):
        return backlog, None  # caught up
    if position < _id(first[0]):
        backlog.unread = length  # its position was trimmed away: every entry is after it
        return backlog, None
    return backlog, found["last-delivered-id"]


def backlogs(broker: BrokerCore, queues: Sequence[str], group: str, *, idle: bool = False,
             cap: int = COUNT_CAP) -> dict[str, Backlog]:
    """The :class:`Backlog` of ``group`` on each of ``queues`` (with ``idle``, its
    :attr:`~Backlog.idle_ms` too): one round trip whatever their number and their
    shards', and one more when a shard's group is behind."""
    shards = [(queue, keys) for queue in queues for keys in broker.shards(queue)]
    found = {queue: Backlog() for queue in queues}
    if not shards:
        return found
    to_count: list[tuple[Backlog, QueueKeys, str]] = []
    per_shard: list[tuple[str, Backlog]] = []
    with broker.read_errors():
        pipe = broker.client.pipeline(transaction=False)
        for _, keys in shards:
            pipe.xinfo_stream(keys.events)
            pipe.xinfo_groups(keys.events)
            if idle:
                pipe.xinfo_consumers(keys.events, group)
        replies = iter(pipe.execute(raise_on_error=False))
        for queue, keys in shards:
            stream, groups = next(replies), next(replies)
            backlog, after = _shard(stream, groups, next(replies) if idle else None, group)
            per_shard.append((queue, backlog))
            if after is not None:
                to_count.append((backlog, keys, after))
        if to_count:
            pipe = broker.client.pipeline(transaction=False)
            for _, keys, after in to_count:
                pipe.xrange(keys.events, min=f"({after}", max="+", count=cap + 1)
            for (backlog, _, _), entries in zip(to_count, pipe.execute(), strict=True):
                backlog.unread, backlog.capped = min(len(entries), cap), len(entries) > cap
    for queue, backlog in per_shard:
        found[queue].add(backlog)
    return found
