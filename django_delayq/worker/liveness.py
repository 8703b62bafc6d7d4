"""Workers alive: each worker's HASH and its heartbeat in the workers ZSET.

The admin dashboard and the API read them; a worker whose heartbeat stops drops out
of the ZSET after its TTL, and its HASH expires.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from redis.exceptions import RedisError

from ..engine import Broker


def record_alive(broker: Broker, name: str, ttl: int, info: dict[str, Any]) -> None:
    """Record ``name`` as alive now (Redis clock) with ``info``; forget long-dead workers."""
    keys = broker.global_keys
    now_ms = broker.server_time_ms()
    pipe = broker.client.pipeline(transaction=False)
    pipe.zadd(keys.workers, {name: now_ms})
    pipe.hset(keys.worker(name), mapping={
        "name": name, "host": socket.gethostname(), "pid": os.getpid(), **info,
        "heartbeat": now_ms,
    })
    pipe.hsetnx(keys.worker(name), "started", now_ms)
    pipe.expire(keys.worker(name), ttl)
    pipe.zremrangebyscore(keys.workers, "-inf", now_ms - ttl * 1000)
    pipe.execute()


def forget(broker: Broker, name: str) -> None:
    """Remove ``name`` from the workers alive (best effort: it expires anyway)."""
    keys = broker.global_keys
    try:
        pipe = broker.client.pipeline(transaction=False)
        pipe.zrem(keys.workers, name)
        pipe.delete(keys.worker(name))
        pipe.execute()
    except RedisError:
        pass
