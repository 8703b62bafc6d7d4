"""How far the model mirror is behind: events of a queue it has not applied yet."""

from __future__ import annotations

from typing import Any

from redis.exceptions import ResponseError

from ..engine import Broker
from .takeover import GROUP


def mirror_lag(broker: Broker, queue: str) -> int:
    """Events of ``queue`` not yet mirrored: not delivered to the mirror's group, plus
    delivered and not yet acknowledged (the whole stream when no mirror ever read it).
    One round trip."""
    shards = broker.shards(queue)
    with broker.connection_errors():
        pipe = broker.client.pipeline(transaction=False)
        for keys in shards:
            pipe.xinfo_groups(keys.events)
            pipe.xlen(keys.events)
        replies = pipe.execute(raise_on_error=False)
        return sum(shard_lag(groups, length)
                   for groups, length in zip(replies[0::2], replies[1::2], strict=True))


def shard_lag(groups: Any, length: Any) -> int:
    """The lag of one shard's stream from its ``XINFO GROUPS`` and ``XLEN`` replies (as
    a pipeline run with ``raise_on_error=False`` gives them): 0 when it has no stream
    yet; any other error is raised."""
    if absent(groups):
        return 0
    for reply in (groups, length):
        if isinstance(reply, Exception):
            raise reply
    group = next((g for g in groups if g.get("name") == GROUP), None)
    if group is None:
        return int(length)
    if group.get("lag") is not None:
        return int(group["lag"]) + int(group.get("pending") or 0)
    # Redis cannot tell (entries deleted past the group's position)
    return int(group.get("pending") or 0)


def absent(reply: Any) -> bool:
    """Whether an ``XINFO`` reply is the error of a stream or group that does not exist
    yet (not one of a refusal: no permission, a node down...)."""
    return isinstance(reply, ResponseError) and str(reply).startswith(("no such key",
                                                                       "NOGROUP"))
