"""The fast paths of the enqueue, fenced: each skips a general mechanism, here.

Each is kept because it buys 5 % or more on a headline figure against the path it
skips: ``python -m bench.fastpaths`` times both in alternating blocks on one Redis
(the gains below range over the medians of three runs of 150 rounds each, redis-py 8.1,
2 cores), and callgrind counted the client's instructions per job.

1. **Argument shapes** (:func:`arg_shape`): checking a call against a task function
   with only positional-or-keyword parameters is a few comparisons where
   ``inspect.Signature.bind`` takes 1.5 to 3 us; a call the shape does not clearly
   accept still goes to ``bind`` for its error (``Task.check_arguments``). Bulk
   enqueue +7 to +12 % (59k to 48k instructions per job), single +4 to +8 %.
2. **Pinned connections** (:mod:`~django_delayq.engine.pinned`): a single script call
   skips redis-py's pool checkout (a lock, a poll of the socket) and its retry wrapper.
   Single enqueue +23 to +46 % (258k to 124k instructions per call; +30 to +75 % on
   redis-py 5, 6 and 7 too).
3. **Packed sends** (also :mod:`~django_delayq.engine.pinned`): a pinned connection
   writes ``hiredis.pack_command``'s bytes, where redis-py 8's packer first copies every
   argument in a Python loop. Single enqueue +5 to +15 % (162k to 124k instructions),
   bulk +7 to +11 % (62k to 48k per job); on redis-py 5 to 7 it saves 1 to 4 % of the
   client's instructions.

Every redis-py internal these use is reached through the functions below
(:func:`checkout`, :func:`send_packed`, :func:`read_reply`, :func:`must_reconnect`,
:func:`retries`, :func:`disconnect`), which adapt to the installed version; the
connection methods they call are listed in :data:`REDIS_PY_CONNECTION_METHODS`. Two
more are here for correctness rather than speed: :func:`send_on_open_socket` (a
connection's socket, for a bulk call's chunks sent before earlier replies are read)
and :func:`reread_cluster_nodes` (a cluster's node table, for :mod:`.cluster_wait`).

``tests/test_fastpaths.py`` and ``tests/test_pinned.py`` check them, and ``tox -e
redis5,redis6,redis7,redislatest`` runs them on each redis-py major version the package
allows, so an upgrade that moves an internal fails a test instead of production.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

import redis
from redis.connection import Connection
from redis.exceptions import ConnectionError as RedisConnectionError

# -- 1. argument shapes ------------------------------------------------------------


@cache
def signature(func: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature(func)``, computed once per function."""
    return inspect.signature(func)


@cache
def positional_names(func: Callable[..., Any]) -> tuple[str, ...]:
    """The names of the parameters of ``func`` that may be given by position."""
    return tuple(
        p.name for p in signature(func).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ArgShape:
    """The parameters of a function that has only positional-or-keyword ones.

    Checking a call against them is a few comparisons where ``Signature.bind`` takes
    microseconds; a call they do not clearly accept goes to ``bind`` for its error.
    """

    names: tuple[str, ...]
    positions: dict[str, int]  # parameter name -> position
    required: int  # the first ``required`` parameters have no default

    def accepts(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        given = len(args)
        if given > len(self.names):
            return False
        if not kwargs:
            return given >= self.required
        positions = self.positions
        for key in kwargs:
            if positions.get(key, -1) < given:  # unknown, or given by position too
                return False
        return all(name in kwargs for name in self.names[given:self.required])


@cache
def arg_shape(func: Callable[..., Any]) -> ArgShape | None:
    """The fast check for ``func``, or None when only ``Signature.bind`` will do."""
    try:
        params = list(signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in params):
        return None
    required = sum(p.default is p.empty for p in params)
    if any(p.default is p.empty for p in params[required:]):
        return None
    names = tuple(p.name for p in params)
    return ArgShape(names, {name: i for i, name in enumerate(names)}, required)


# -- 2. redis-py internals of the pinned connections -------------------------------

#: Methods of a redis-py ``Connection`` that the functions below call (and
#: ``should_reconnect`` where the version has it, see :func:`must_reconnect`).
REDIS_PY_CONNECTION_METHODS = ("send_packed_command", "read_response", "disconnect")


def _pool_takes_command_name() -> bool:
    """Whether ``ConnectionPool.get_connection`` still requires a command name (redis-py
    5.x; 6.0 made it optional and later versions deprecate it)."""
    parameter = inspect.signature(redis.ConnectionPool.get_connection).parameters.get(
        "command_name")
    return parameter is not None and parameter.default is inspect.Parameter.empty


_NEEDS_COMMAND_NAME = _pool_takes_command_name()


def checkout(pool: Any) -> Any:
    """A connection of ``pool``, connected (``pool.release`` gives it back)."""
    if _NEEDS_COMMAND_NAME:
        return pool.get_connection("EVALSHA")
    return pool.get_connection()


def send_packed(conn: Any, packed: list[bytes]) -> None:
    """Write commands already packed (``hiredis.pack_command``) on ``conn``."""
    conn.send_packed_command(packed)


def send_on_open_socket(conn: Any, packed: list[bytes]) -> None:
    """Write commands already packed on the socket ``conn`` has open, with no health
    check (its PING would read a reply due) and never on a new socket:
    ``send_packed_command`` opens a closed connection again (``pool.disconnect()``
    closes connections in use), and the replies due on the old one would be lost."""
    sock = conn._sock
    if sock is None:
        raise RedisConnectionError("the connection was closed with replies due on it")
    try:
        for part in packed:
            sock.sendall(part)
    except OSError as exc:
        raise RedisConnectionError(f"writing failed with replies due: {exc}") from exc


def read_reply(conn: Any) -> Any:
    """Read one reply on ``conn``, decoded as the client would (an error reply raises)."""
    return conn.read_response()


def disconnect(conn: Any) -> None:
    """Close ``conn``'s socket (a reply may be half read: it is never reused)."""
    conn.disconnect()


def _has_should_reconnect() -> bool:
    return hasattr(Connection, "should_reconnect")


#: Whether connections have ``should_reconnect()`` (redis-py 6+: a server maintenance
#: notice marks a connection to be replaced; 5.x has no such mark, and never needs it).
HAS_SHOULD_RECONNECT = _has_should_reconnect()


def must_reconnect(conn: Any) -> bool:
    """Whether redis-py marked ``conn`` to be replaced."""
    return HAS_SHOULD_RECONNECT and bool(conn.should_reconnect())


def retries(conn: Any) -> int:
    """How many times the client would retry a command that timed out on ``conn``
    (``Retry.get_retries()``; redis-py 5.x keeps the count in ``_retries``)."""
    retry = conn.retry
    get = getattr(retry, "get_retries", None)
    return int(get() if get is not None else retry._retries)


# -- a Redis Cluster's node table ----------------------------------------------------


def reread_cluster_nodes(client: Any) -> None:
    """Read the node table of the cluster ``client`` talks to again (redis-py's
    ``NodesManager.initialize()``, what its cluster client does itself after a connection
    error or a ``MOVED`` reply), for calls sent to a node's own client
    (:mod:`.cluster_wait`), which redis-py does not watch."""
    client.nodes_manager.initialize()
