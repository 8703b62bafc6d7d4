"""How far the model mirror is behind: events of a queue it has not applied yet."""

from __future__ import annotations

from redis.exceptions import ResponseError

from ..engine import Broker
from .takeover import GROUP


def mirror_lag(broker: Broker, queue: str) -> int:
    """Events of ``queue`` not yet mirrored: not delivered to the mirror's group, plus
    delivered and not yet acknowledged (the whole stream when no mirror ever read it)."""
    lag = 0
    with broker.connection_errors():
        for keys in broker.shards(queue):
            try:
                groups = broker.client.xinfo_groups(keys.events)
            except ResponseError:  # no stream yet
                continue
            group = next((g for g in groups if g.get("name") == GROUP), None)
            if group is None:
                lag += int(broker.client.xlen(keys.events))
            elif group.get("lag") is not None:
                lag += int(group["lag"]) + int(group.get("pending") or 0)
            else:  # Redis cannot tell (entries deleted past the group's position)
                lag += int(group.get("pending") or 0)
    return lag
