"""The wait between retries of a loop whose Redis or database keeps failing."""

from __future__ import annotations

import threading

from redis.exceptions import RedisClusterException, RedisError

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


class Backoff:
    """Waits ``first`` seconds, doubling after each wait up to ``cap``; :meth:`reset`
    starts over. A wait is cut short when ``stop`` is set."""

    def __init__(self, stop: threading.Event, *, first: float, cap: float) -> None:
        self._stop = stop
        self._first = first
        self._cap = cap
        self.delay = first

    def reset(self) -> None:
        self.delay = self._first

    def wait(self) -> None:
        """Sleep the current delay (cut short by ``stop``), then double it."""
        self._stop.wait(self.delay)
        self.delay = min(self._cap, self.delay * 2)
