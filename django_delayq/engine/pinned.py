"""Single commands on connections pinned out of a redis-py pool, without a checkout each.

redis-py checks a connection out of its pool and back in for every command: a lock,
a ``can_read()`` poll of the socket, metrics bookkeeping, then the client's retry
wrapper. That costs about as much as the round trip of a small command, which doubles
the Python cost of a single :meth:`~django_delayq.engine.Broker.enqueue`.
:class:`PinnedConnections` takes a few connections from the pool once and keeps them in
a free list; each call pops one, sends the command, reads the reply and pushes it back
(``list.pop``/``append`` are atomic, so threads never share a connection).

It stays as safe as the client path: a forked child drops the parent's connections; a
connection that raised anything but an error reply is disconnected and never reused;
a connection error (or a timeout, if the client retries them) falls back to the
client path, whose retry policy applies; health checks and reply decoding are the
connection's own, as on the client path.
Commands sent this way are not counted by redis-py's optional metrics. Every redis-py
internal this relies on is reached through :mod:`.fastpaths`, which adapts it to the
installed version.
"""

from __future__ import annotations

import os
from typing import Any

import redis

# redis-py 8's packer copies every argument in a Python loop before calling this one
# (fastpaths.py: packed sends; a dependency: redis[hiredis])
from hiredis import pack_command
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .failover import hold_connections
from .fastpaths import (
    checkout,
    disconnect,
    must_reconnect,
    read_reply,
    retries,
    send_on_open_socket,
    send_packed,
)

#: Connections kept idle at most; more threads at once take and give back pool ones.
MAX_PINNED = 8


class PinnedConnections:
    """A free list of connections of one plain ``redis.Redis`` client's pool."""

    def __init__(self, client: Any, max_pinned: int = MAX_PINNED) -> None:
        self._client = client
        self._pool = client.connection_pool
        self._max_pinned = max_pinned
        self._free: list[Any] = []
        self._pid = os.getpid()
        #: Bumped by :meth:`switched`. Each connection carries the one it was checked out
        #: of the pool in; one of an older generation is closed as it comes back.
        self._generation = 0
        hold_connections(self._pool, self)

    @classmethod
    def for_client(cls, client: Any) -> PinnedConnections | None:
        """Pinned connections for ``client``, or None where only the client path is right.

        Only a plain ``redis.Redis`` (Sentinel pools included) qualifies: not a cluster
        client, a single-connection client or a pool with client-side caching. Pinning
        connections takes them from the pool, so a small pool is left alone.
        """
        if type(client) is not redis.Redis or getattr(client, "connection", None) is not None:
            return None
        pool = getattr(client, "connection_pool", None)
        if pool is None or getattr(pool, "cache", None) is not None:
            return None
        max_pinned = min(MAX_PINNED, getattr(pool, "max_connections", 0) // 4)
        return cls(client, max_pinned) if max_pinned > 0 else None

    def execute(self, *args: Any) -> Any:
        """Send one command and return its reply, decoded as the client would."""
        packed = [pack_command(args)]  # bad arguments raise TypeError before any I/O
        conn = self._take()
        try:
            send_packed(conn, packed)
            reply = read_reply(conn)
        except ResponseError:
            self._give_back(conn)  # an error reply leaves the connection in step
            raise
        except RedisConnectionError:
            # A socket the server closed (a restart) shows here, where the pool's checkout
            # would have replaced it: the client path connects again, with its retries.
            self._discard(conn)
            return self._client.execute_command(*args)
        except RedisTimeoutError:
            self._discard(conn)
            if retries(conn) == 0:
                raise
            return self._client.execute_command(*args)  # retried, as the client would
        except BaseException:
            self._discard(conn)  # a reply may be half read: never reuse this socket
            raise
        self._give_back(conn)
        return reply

    def execute_many(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Send ``commands`` in one write and read their replies, in one round trip.

        An error reply takes its command's place in the list (the connection stays in
        step); a connection error falls back to a client pipeline, as :meth:`execute`
        falls back to the client.
        """
        packed = [pack_command(args) for args in commands]
        conn = self._take()
        replies: list[Any] = []
        try:
            send_packed(conn, packed)
            for _ in commands:
                try:
                    replies.append(read_reply(conn))
                except ResponseError as exc:
                    replies.append(exc)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            self._discard(conn)
            if isinstance(exc, RedisTimeoutError) and retries(conn) == 0:
                raise
            pipe = self._client.pipeline(transaction=False)
            for args in commands:
                pipe.execute_command(*args)
            return list(pipe.execute(raise_on_error=False))
        except BaseException:
            self._discard(conn)
            raise
        self._give_back(conn)
        return replies

    def hold(self) -> Any:
        """A connection for the caller alone until :meth:`release`: for commands sent
        before the replies of earlier ones are read (:meth:`send`, :meth:`read`)."""
        return self._take()

    def release(self, conn: Any, *, in_step: bool) -> None:
        """Give back a held connection; one not ``in_step`` (a reply unread, half read,
        or a socket that failed) is disconnected first."""
        if in_step:
            self._give_back(conn)
        else:
            self._discard(conn)

    @staticmethod
    def send(conn: Any, *args: Any, replies_due: bool) -> None:
        """Write one command on a held connection; its reply is read by :meth:`read`.
        With ``replies_due`` (commands sent before it are not yet answered), it goes on
        the socket those went on or raises ``ConnectionError``: no health check (its
        PING would read their replies), and no new socket for a connection closed under
        its holder (their replies are gone with the old one)."""
        packed = [pack_command(args)]
        if replies_due:
            send_on_open_socket(conn, packed)
        else:
            send_packed(conn, packed)

    @staticmethod
    def read(conn: Any) -> Any:
        """The reply of the oldest command sent on a held connection and not yet read (an
        error reply raises, and leaves the connection in step)."""
        return read_reply(conn)

    def _take(self) -> Any:
        """A pinned connection, or one checked out of the pool if none is free."""
        if self._pid != os.getpid():
            self._forget_parent_connections()
        try:
            return self._free.pop()
        except IndexError:
            generation = self._generation  # read first: a switch meanwhile makes it stale
            conn = checkout(self._pool)
            conn.delayq_generation = generation
            return conn

    def switched(self) -> None:
        """The sentinels switched the primary: close the idle pinned connections now,
        and each one a call holds as it comes back (they reach the old primary)."""
        self._generation += 1
        while self._free:
            try:
                conn = self._free.pop()
            except IndexError:
                return
            self._discard(conn)

    def close(self) -> None:
        """Hand every idle pinned connection back to the pool."""
        while self._free:
            try:
                conn = self._free.pop()
            except IndexError:
                return
            self._pool.release(conn)

    def _give_back(self, conn: Any) -> None:
        if conn.delayq_generation != self._generation:
            self._discard(conn)
        elif len(self._free) < self._max_pinned and not must_reconnect(conn):
            self._free.append(conn)
        else:
            self._pool.release(conn)

    def _discard(self, conn: Any) -> None:
        disconnect(conn)
        self._pool.release(conn)

    def _forget_parent_connections(self) -> None:
        # The parent's sockets are not ours to use; the pool resets itself likewise.
        self._free = []
        self._pid = os.getpid()
