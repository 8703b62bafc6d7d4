"""A TCP endpoint that forwards to a Redis server chosen at run time: what a managed
service's primary endpoint does (a DNS name or a virtual address moved to the new
primary after a failover). Connections made before a move stay on the server they
reached, as they would through a moved DNS name; new ones reach the new server.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Self


class Endpoint:
    """Listens on a free loopback port and forwards each connection to ``target``."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def point_to(self, target: int) -> None:
        """New connections reach ``target`` from now on."""
        self.target = target

    def __enter__(self) -> Self:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._listener.close()
        for sock in list(self._sockets):
            sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
