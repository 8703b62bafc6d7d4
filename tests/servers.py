"""The test suite's Redis Sentinel groups and Clusters, made of throwaway servers.

Built on the one server that ships (:class:`django_delayq.testing.RedisServer`); they
live with the tests (``bench/`` uses them too), not in the package: a user's tests need
one Redis, the suite's high-availability tests need these. pytest-redis, the maintained
plugin, starts one session-scoped server per fixture (no TLS, no replica, no Sentinel or
Cluster), where these tests start, kill and restart servers inside a test.
"""

from __future__ import annotations

import os
import random
import socket
import time
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import redis

from django_delayq.testing import RedisServer

#: A replica's first copy starts at once (Redis waits 5 s for more replicas by default).
REPLICATION_ARGS = ("--repl-diskless-sync-delay", "0")
CLUSTER_SLOTS = 16384


def quiet_port(also_free: int = 0) -> int:
    """A free loopback port below the kernel's ephemeral range (32768 and up by default),
    for a server that binds it later: a client's outgoing connection takes its local port
    from that range, and could take a port picked there before the server binds it. With
    ``also_free``, the port that much above it is free too."""
    for _ in range(200):
        port = random.randint(12_000, 32_000 - also_free)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                if also_free:
                    b.bind(("127.0.0.1", port + also_free))
        except OSError:
            continue
        return port
    raise RuntimeError("no free loopback port below the ephemeral range")


def free_cluster_port() -> int:
    """A :func:`quiet_port` whose cluster bus port (10000 above it) is free too."""
    return quiet_port(also_free=10_000)


class _ClusterNode(RedisServer):
    """A Cluster node on a :func:`free_cluster_port`. A port another process took between
    the pick and the bind is swapped for another until the node first starts; from then
    on the cluster's topology names the port, so a restart keeps it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(port=free_cluster_port(), **kwargs)
        self._port_given = False

    def _another_port(self) -> int:
        return free_cluster_port()

    def start(self) -> Self:
        super().start()
        self._port_given = True
        return self


class _Group:
    """Servers that live in a ``with`` block: ``start()`` on entry, ``cleanup()`` on exit."""

    def start(self) -> Self:
        raise NotImplementedError

    def cleanup(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()


class SentinelServer(RedisServer):
    """A ``redis-server --sentinel`` process monitoring ``service`` at ``primary_port``.

    Its config file is generated (Sentinel rewrites it as it learns the topology);
    it declares the primary down after ``down_after_ms`` without an answer.
    """

    def __init__(self, service: str, primary_port: int, *, quorum: int = 2,
                 down_after_ms: int = 1000, failover_timeout_ms: int = 5000,
                 binary: str | None = None) -> None:
        super().__init__(binary=binary)
        self.config = Path(self.dir, "sentinel.conf")
        self._monitor = (f"sentinel monitor {service} 127.0.0.1 {primary_port} {quorum}\n"
                         f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
                         f"sentinel failover-timeout {service} {failover_timeout_ms}\n"
                         f"sentinel parallel-syncs {service} 1\n")

    def _command(self) -> list[str]:
        # Written at each start: the port may have changed (see RedisServer.start).
        self.config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.dir}\n"
            f"logfile {os.path.join(self.dir, 'redis.log')}\nloglevel warning\n"
            + self._monitor)
        return [self.binary, str(self.config), "--sentinel", "--daemonize", "no"]


class RedisSentinelGroup(_Group):
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels on loopback.

    ``url`` is a ``redis+sentinel://`` URL naming every sentinel. ``start()`` returns
    once the replicas are in sync and every sentinel knows every replica and the
    other sentinels, so a failover can start as soon as the primary dies.
    """

    def __init__(self, *, service: str = "mymaster", replicas: int = 1, sentinels: int = 3,
                 down_after_ms: int = 1000, binary: str | None = None) -> None:
        self.service = service
        self._not_ready = ""
        self._sizes = (replicas, sentinels, down_after_ms)
        self.primary = RedisServer(binary=binary, extra_args=REPLICATION_ARGS)
        # Made by start(), once the primary's port is final.
        self.replicas: list[RedisServer] = []
        self.sentinels: list[SentinelServer] = []

    @property
    def servers(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    def url(self, db: int = 0) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/{db}"

    def start(self, timeout: float = 30.0) -> RedisSentinelGroup:
        replicas, sentinels, down_after_ms = self._sizes
        binary = self.primary.binary
        try:
            self.primary.start()
            self.replicas = [
                RedisServer(binary=binary, extra_args=(
                    "--replicaof", "127.0.0.1", str(self.primary.port), *REPLICATION_ARGS))
                for _ in range(replicas)]
            self.sentinels = [
                SentinelServer(self.service, self.primary.port, quorum=sentinels // 2 + 1,
                               down_after_ms=down_after_ms, binary=binary)
                for _ in range(sentinels)]
            for server in [*self.replicas, *self.sentinels]:
                server.start()
            self._wait(lambda: self._ready(), timeout,
                       lambda: f"did not settle ({self._not_ready})")
        except BaseException:
            self.cleanup()
            raise
        return self

    def primary_port(self) -> int | None:
        """The port every live sentinel names as the primary, or None if they differ."""
        ports = set()
        for sentinel in self.sentinels:
            if sentinel.process is None:
                continue
            try:
                with redis.Redis(port=sentinel.port, socket_timeout=1) as client:
                    address = client.execute_command(
                        "SENTINEL GET-MASTER-ADDR-BY-NAME", self.service)
            except redis.RedisError:
                return None
            ports.add(int(address[1]) if address else None)
        return ports.pop() if len(ports) == 1 else None

    def wait_failover(self, old_port: int, timeout: float = 30.0) -> RedisServer:
        """Wait until every sentinel names the same new primary, and return it."""
        self._wait(lambda: self.primary_port() not in (None, old_port), timeout,
                   "did not fail over")
        port = self.primary_port()
        return next(s for s in self.servers if s.port == port)

    def _ready(self) -> bool:
        with redis.Redis(port=self.primary.port, decode_responses=True) as primary:
            info = primary.info("replication")
            online = [v for k, v in info.items()
                      if k.startswith("slave") and isinstance(v, dict)
                      and v.get("state") == "online"]
            if len(online) < len(self.replicas):
                # a replica still loading its first copy does not ack
                self._not_ready = f"replicas online: {info}"
                return False
        for sentinel in self.sentinels:
            with redis.Redis(port=sentinel.port, decode_responses=True) as client:
                known = client.execute_command("SENTINEL SENTINELS", self.service)
                replicas = client.execute_command("SENTINEL REPLICAS", self.service)
            if len(known) < len(self.sentinels) - 1 or len(replicas) < len(self.replicas):
                self._not_ready = (f"sentinel {sentinel.port} knows {len(known)} sentinels, "
                                   f"{len(replicas)} replicas")
                return False
        return True

    @staticmethod
    def _wait(done: Any, timeout: float, what: Any) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the Sentinel group {what() if callable(what) else what} "
                           f"in {timeout}s")

    def cleanup(self) -> None:
        for server in [*self.sentinels, *self.servers]:
            server.cleanup()


class RedisCluster(_Group):
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
            _ClusterNode(binary=binary,
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
        with redis.Redis(port=port, decode_responses=True) as client:
            info = client.info("replication")
        ports = {int(v["port"]) for k, v in info.items()
                 if k.startswith("slave") and isinstance(v, dict)}
        return [node for node in self.nodes if node.port in ports]

    def wait_failover(self, key: str, old_port: int, timeout: float = 60.0) -> int:
        """Wait until a replica serves ``key``'s slot in place of ``old_port`` and every
        live node says ``cluster_state:ok``; return the new primary's port."""
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
