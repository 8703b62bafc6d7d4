"""A throwaway Redis Cluster, made without redis-cli."""

from __future__ import annotations

import time
from typing import Any

from .common import REPLICATION_ARGS, Throwaway, free_cluster_port
from .server import RedisServer

CLUSTER_SLOTS = 16384


class RedisCluster(Throwaway):
    """A throwaway Redis Cluster of ``masters`` primaries, each with ``replicas`` replicas.

    ``url`` is a ``redis+cluster://`` URL for ``DELAYQ["REDIS_URL"]``. The nodes keep no
    data on disk; ``cleanup()`` stops them and removes their directories. Any
    ``redis-server`` :class:`RedisServer` finds will do (redis-cli is not needed).
    """

    def __init__(self, masters: int = 3, *, replicas: int = 0, node_timeout_ms: int = 5000,
                 binary: str | None = None) -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least 3 primaries")
        self.masters = masters
        # nodes[:masters] start as primaries; the next ``replicas`` per primary replicate
        # nodes[i % masters].
        self.nodes = [
            RedisServer(port=free_cluster_port(), binary=binary,
                        extra_args=("--cluster-enabled", "yes", "--cluster-config-file",
                                    "nodes.conf", "--cluster-node-timeout",
                                    str(node_timeout_ms), *REPLICATION_ARGS))
            for _ in range(masters * (1 + replicas))
        ]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

    @property
    def seeds_url(self) -> str:
        """A URL naming every node as a seed (what a production URL should do)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports) + "/0"

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def start(self) -> RedisCluster:
        """Start the nodes, split the 16384 slots between them, join them, and wait
        for ``cluster_state:ok`` (what ``redis-cli --cluster create`` does, without
        needing redis-cli)."""
        import redis

        try:
            for node in self.nodes:
                node.start()
            clients = [redis.Redis(port=port, decode_responses=True) for port in self.ports]
            try:
                per_node = -(-CLUSTER_SLOTS // self.masters)
                for i, client in enumerate(clients[:self.masters]):
                    client.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
                    slots = range(i * per_node, min(CLUSTER_SLOTS, (i + 1) * per_node))
                    client.execute_command("CLUSTER ADDSLOTS", *slots)
                for port in self.ports[1:]:
                    clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port)
                self._wait_ok(clients)
                self._add_replicas(clients)
            finally:
                for client in clients:
                    client.close()
        except BaseException:
            self.cleanup()
            raise
        return self

    def _wait_ok(self, clients: list[Any], timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            # redis-py parses CLUSTER INFO into a dict
            infos = [client.execute_command("CLUSTER INFO") for client in clients]
            if all(info.get("cluster_state") == "ok"
                   and int(info.get("cluster_known_nodes", 0)) == len(clients)
                   for info in infos):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the Redis Cluster on ports {self.ports} did not reach "
                           f"cluster_state:ok in {timeout}s")

    def _add_replicas(self, clients: list[Any], timeout: float = 30.0) -> None:
        if len(clients) == self.masters:
            return
        ids = [client.execute_command("CLUSTER MYID") for client in clients[:self.masters]]
        for i, client in enumerate(clients[self.masters:]):
            client.execute_command("CLUSTER REPLICATE", ids[i % self.masters])
        deadline = time.monotonic() + timeout
        want = (len(clients) - self.masters) // self.masters
        while time.monotonic() < deadline:
            online = [sum(1 for k, v in c.info("replication").items()
                          if k.startswith("slave") and isinstance(v, dict)
                          and v.get("state") == "online")
                      for c in clients[:self.masters]]
            if all(n >= want for n in online):
                return
            time.sleep(0.05)
        raise RuntimeError(f"the replicas of the Redis Cluster on ports {self.ports} did not "
                           f"come online in {timeout}s")

    def primary_port_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot, as a live node sees it."""
        import redis

        for node in self.nodes:
            if node.process is None:
                continue
            with redis.Redis(port=node.port) as client:
                slot = int(client.execute_command("CLUSTER KEYSLOT", key))
                for start, end, primary, *_ in client.execute_command("CLUSTER SLOTS"):
                    if int(start) <= slot <= int(end):
                        return int(primary[1])
        raise RuntimeError("no live node of the cluster answers")

    def replicas_of(self, port: int) -> list[RedisServer]:
        """The nodes replicating the primary at ``port``, as it lists them."""
        import redis

        with redis.Redis(port=port, decode_responses=True) as client:
            info = client.info("replication")
        ports = {int(v["port"]) for k, v in info.items()
                 if k.startswith("slave") and isinstance(v, dict)}
        return [node for node in self.nodes if node.port in ports]

    def wait_failover(self, key: str, old_port: int, timeout: float = 60.0) -> int:
        """Wait until a replica serves ``key``'s slot in place of ``old_port`` and every
        live node says ``cluster_state:ok``; return the new primary's port."""
        import redis

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.primary_port_of(key)
            if port != old_port:
                live = [redis.Redis(port=n.port, decode_responses=True)
                        for n in self.nodes if n.process is not None]
                try:
                    if all(c.execute_command("CLUSTER INFO").get("cluster_state") == "ok"
                           for c in live):
                        return port
                finally:
                    for c in live:
                        c.close()
            time.sleep(0.1)
        raise RuntimeError(f"no replica took over from port {old_port} in {timeout}s")

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()
