"""Chunks sent in order from a thread of their own: :class:`ChunkSender`, with which a bulk
enqueue that cannot pipeline its chunks (:class:`.bulk.Pipelined`) still sends chunk
*n* while the caller encodes chunk *n + 1*."""

from __future__ import annotations

import queue as stdlib_queue
import threading
from collections.abc import Callable
from typing import Any

#: One chunk of jobs, in the form the caller's ``send_chunk`` takes.
Chunk = list[Any]


class ChunkSender:
    """Sends chunks in order through ``send_chunk``; :meth:`finish` waits for all of them.

    An error of ``send_chunk`` stops the sending: the next :meth:`send` or
    :meth:`finish` raises it, and no later chunk is sent.
    """

    def __init__(self, send_chunk: Callable[[Chunk], None]) -> None:
        self._send_chunk = send_chunk
        self._pending: Chunk | None = None  # the first chunk, kept until a second comes
        self._queue: stdlib_queue.Queue[Chunk | None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._finished = False

    def send(self, chunk: Chunk) -> None:
        """Send ``chunk`` after the chunks sent before it."""
        self._raise_error()
        if self._queue is None:
            if self._pending is None:
                self._pending = chunk
                return
            self._queue = stdlib_queue.Queue(maxsize=2)
            self._thread = threading.Thread(target=self._run, name="delayq-bulk", daemon=True)
            self._thread.start()
            self._queue.put(self._pending)
            self._pending = None
        self._queue.put(chunk)

    def finish(self) -> None:
        """Wait until every chunk is sent; raise the error that stopped the sending."""
        if not self._finished:
            self._finished = True
            if self._queue is None:
                if self._pending is not None:
                    pending, self._pending = self._pending, None
                    self._send_chunk(pending)
            else:
                self._queue.put(None)
                assert self._thread is not None
                self._thread.join()
        self._raise_error()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def _run(self) -> None:
        assert self._queue is not None
        while True:
            chunk = self._queue.get()
            if chunk is None:
                return
            if self._error is None:
                try:
                    self._send_chunk(chunk)
                except BaseException as exc:  # handed to the caller's thread
                    self._error = exc
