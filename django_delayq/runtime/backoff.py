"""How long the runtime's loops wait while Redis fails (one backoff policy:
:class:`~django_delayq.engine.backoff.Backoff`), and what they catch as "Redis failed,
try again later" (:data:`~django_delayq.engine.failover.CALL_FAILED`, the engine's one
definition: any RedisError, RedisClusterException, which redis-py raises when no node of
a Cluster answers, and the engine's own errors; a loop that let one through would end
its thread for good)."""

from __future__ import annotations

from ..engine.backoff import Backoff
from ..engine.failover import CALL_FAILED

#: Waits between retries while Redis is unreachable: the first, and the longest.
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 5.0
#: A shard that refuses a call its siblings answered (a Redis Cluster slot on the move
#: says TRYAGAIN) backs off: it is left out of claims, or its acks are deferred, for
#: this long, so the others run at full speed.
SHARD_BACKOFF = 1.0

__all__ = ["CALL_FAILED", "FIRST_BACKOFF", "MAX_BACKOFF", "SHARD_BACKOFF", "Backoff"]
