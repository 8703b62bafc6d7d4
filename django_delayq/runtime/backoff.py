"""What a loop whose Redis keeps failing catches, and how long it waits
(:class:`~django_delayq.engine.backoff.Backoff`, the one backoff policy)."""

from __future__ import annotations

from redis.exceptions import RedisClusterException, RedisError

from ..engine.backoff import Backoff

#: What a worker's loops catch as "Redis failed: try again later": any RedisError, and
#: RedisClusterException, which redis-py raises (it is not a RedisError) when no node of
#: a Redis Cluster answers; a loop that let it through would end its thread for good.
REDIS_ERRORS = (RedisError, RedisClusterException)
#: Waits between retries while Redis is unreachable: the first, and the longest.
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 5.0
#: A shard that refuses a call its siblings answered (a Redis Cluster slot on the move
#: says TRYAGAIN) backs off: it is left out of claims, or its acks are deferred, for
#: this long, so the others run at full speed.
SHARD_BACKOFF = 1.0


__all__ = ["FIRST_BACKOFF", "MAX_BACKOFF", "REDIS_ERRORS", "SHARD_BACKOFF", "Backoff"]
