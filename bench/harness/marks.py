"""What the benchmark's tasks do: count a finished no-op job, record a delayed job's
lateness, note a moment; the Redis keys these write.

Every library runs the same task bodies, so a job costs each of them the same:

* the no-op task calls :func:`mark_done`, which only counts the job in its process. A
  thread of each worker process reports the count every few milliseconds (one EVALSHA
  of ``lua/done.lua``: add to the shared count, and stamp the count reached with the
  Redis time when it passes the start, the ends of the measured window or the total, and
  on each process's first report). A no-op job thus costs no Redis call of its own.
* the lateness task calls :func:`mark_late` (one EVALSHA of ``lua/late.lua``: Redis
  ``TIME`` minus the due time, pushed onto a list), so lateness is read on the Redis
  clock for everyone.

The reporter speaks to Redis on a plain socket of its own, its commands packed and its
replies parsed by hiredis, not through redis-py: the two virtualenvs hold different
redis-py versions, and the count must cost every library the same. This module imports
the standard library, redis-py and hiredis, which both virtualenvs have.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import threading
import time
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import hiredis
import redis

COUNT_KEY = "bench:count"
FIRST_KEY = "bench:first"
LAST_KEY = "bench:last"
WINDOW_KEY = "bench:window"  # "lo hi n": the job counts that open and close the window, all
WINDOW_LO_KEY = "bench:window:lo"
WINDOW_HI_KEY = "bench:window:hi"
FIRSTS_KEY = "bench:firsts"  # HASH pid -> "count stamp" of that process's first job
DONE_KEYS = [COUNT_KEY, FIRST_KEY, LAST_KEY, WINDOW_LO_KEY, WINDOW_HI_KEY, FIRSTS_KEY]
LATE_KEY = "bench:late"
# Connections the lateness task's client opens ahead: more than any worker's threads.
WARM_CONNECTIONS = 16
URL_ENV = "BENCH_REDIS_URL"
REPORT_EVERY_S = 0.002  # how long a report waits for more jobs once one is counted


@functools.cache
def lua(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return (resources.files(__package__) / "lua" / f"{name}.lua").read_text()


def redis_url() -> str:
    return os.environ[URL_ENV]


class PlainConnection:
    """One Redis connection on a plain socket: commands packed by ``hiredis.pack_command``,
    replies parsed by a ``hiredis.Reader``. Error replies raise."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 6379))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = hiredis.Reader()
        db = int(parts.path.strip("/") or 0)
        if db:
            self.call("SELECT", db)

    def call(self, *parts: Any) -> Any:
        self.sock.sendall(hiredis.pack_command(parts))
        reply = self.reader.gets()
        while reply is False:  # False: no whole reply read yet (None is a nil reply)
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("redis closed the connection")
            self.reader.feed(data)
            reply = self.reader.gets()
        if isinstance(reply, hiredis.ReplyError):
            raise RuntimeError(f"redis: {reply}")
        return reply

    def close(self) -> None:
        self.sock.close()


class DoneReporter:
    """Counts the no-op jobs of this process; a daemon thread adds them to the shared
    count in Redis at most every REPORT_EVERY_S while jobs finish."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending = 0
        self.wake = threading.Event()
        threading.Thread(target=self._run, name="bench-done", daemon=True).start()

    def add(self) -> None:
        with self.lock:
            self.pending += 1
            if self.pending == 1:
                self.wake.set()

    def _run(self) -> None:
        conn = PlainConnection(redis_url())
        sha = conn.call("SCRIPT", "LOAD", lua("done"))
        lo, hi, n = [*(conn.call("GET", WINDOW_KEY) or b"").split(), b"0", b"0", b"0"][:3]
        first = 1
        while True:
            self.wake.wait()
            time.sleep(REPORT_EVERY_S)
            with self.lock:
                jobs, self.pending = self.pending, 0
                self.wake.clear()
            conn.call("EVALSHA", sha, len(DONE_KEYS), *DONE_KEYS, os.getpid(), first, jobs,
                      lo, hi, n)
            first = 0


_reporter: DoneReporter | None = None
_reporter_lock = threading.Lock()


def _forget_reporter() -> None:
    # A forked child has none of its parent's threads: it starts a reporter of its own.
    global _reporter, _reporter_lock
    _reporter, _reporter_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_reporter)


def mark_done() -> None:
    """The no-op task's body: count one finished job (no I/O).

    A process's first call also readies the lateness task's client (see ``client``):
    every workload starts with a no-op job, outside the clock."""
    global _reporter
    reporter = _reporter
    if reporter is None:
        with _reporter_lock:
            if _reporter is None:
                client()
                _reporter = DoneReporter()
            reporter = _reporter
    reporter.add()


_sync_client: redis.Redis | None = None
_sync_pid = 0
_sync_scripts: dict[str, Any] = {}


def client() -> redis.Redis:
    """This process's client for the lateness task, ready before any clock starts: its
    script loaded and ``WARM_CONNECTIONS`` connections open. Opened on a worker thread's
    first due job instead, a connection (1-2 ms on a slow VM, several at once) would be
    counted as that job's lateness: the instrument's, not the queue's."""
    global _sync_client, _sync_pid
    if _sync_client is None or _sync_pid != os.getpid():
        new = redis.Redis.from_url(redis_url())
        _sync_scripts["late"] = new.register_script(lua("late"))
        new.script_load(lua("late"))
        pool, opened = new.connection_pool, []
        try:
            for _ in range(WARM_CONNECTIONS):
                try:
                    opened.append(pool.get_connection())
                except TypeError:  # redis-py 5 wants a command name
                    opened.append(pool.get_connection("PING"))
        finally:
            for conn in opened:
                pool.release(conn)
        _sync_client, _sync_pid = new, os.getpid()
    return _sync_client


def mark_late(due_us: int) -> None:
    """The lateness task's body: push start - due (µs, Redis clock) onto LATE_KEY."""
    client()
    due_s, due_frac = divmod(int(due_us), 1_000_000)
    _sync_scripts["late"](keys=[LATE_KEY], args=[due_s, due_frac])


def note_time(conn: redis.Redis, key: str) -> None:
    """Raise ``key`` to the Redis time now, in µs (``lua/max_time.lua``)."""
    conn.eval(lua("max_time"), 1, key)


class AsyncMarks:
    """The same two task bodies for asyncio workers (arq, SAQ): the lateness task's
    call goes through redis.asyncio."""

    def __init__(self) -> None:
        import redis.asyncio as aredis

        self.client = aredis.Redis.from_url(redis_url())
        self.late_script = self.client.register_script(lua("late"))
        self.ready = False

    async def done(self) -> None:
        if not self.ready:  # as client(): script loaded, connections open
            self.ready = True
            await self.client.script_load(lua("late"))
            await asyncio.gather(*(self.client.ping() for _ in range(WARM_CONNECTIONS)))
        mark_done()

    async def late(self, due_us: int) -> None:
        due_s, due_frac = divmod(int(due_us), 1_000_000)
        await self.late_script(keys=[LATE_KEY], args=[due_s, due_frac])


_async_marks: AsyncMarks | None = None


def async_marks() -> AsyncMarks:
    """The asyncio task bodies, created on first use inside the worker's event loop."""
    global _async_marks
    if _async_marks is None:
        _async_marks = AsyncMarks()
    return _async_marks
