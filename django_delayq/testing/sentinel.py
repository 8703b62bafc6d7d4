"""A throwaway Sentinel group: a primary, its replicas and the sentinels watching it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from .common import REPLICATION_ARGS, Throwaway
from .server import RedisServer


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


class RedisSentinelGroup(Throwaway):
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
        import redis

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
        import redis

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
