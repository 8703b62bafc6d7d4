"""The fast paths the benchmark proves, fenced: each skips a general mechanism, here.

1. **Argument shapes** (:func:`arg_shape`): checking a call against a task function
   with only positional-or-keyword parameters is a few comparisons where
   ``inspect.Signature.bind`` takes microseconds; a call the shape does not clearly
   accept still goes to ``bind`` for its error (``Task.check_arguments``).
2. **Pinned connections** (:mod:`~django_delayq.engine.pinned`): a single script call
   skips redis-py's pool checkout. Every redis-py internal it uses is reached through
   the functions below (:func:`checkout`, :func:`send_packed`, :func:`read_reply`,
   :func:`must_reconnect`, :func:`retries`, :func:`disconnect`), which adapt to the
   installed version; the connection methods they call are listed in
   :data:`REDIS_PY_CONNECTION_METHODS`.
3. **Enqueue errors** (``Broker.enqueue``): a ``try``/``except FAILOVER`` instead of
   the ``connection_errors()`` context manager, which costs a generator per call.

One more redis-py internal is reached here, for correctness rather than speed:
:func:`reread_cluster_nodes` (a cluster's node table, for :mod:`.cluster_wait`).

``tests/test_fastpaths.py`` and ``tests/test_pinned.py`` check all three, and ``tox -e
redis5,redis6,redis7,redislatest`` runs them on each redis-py major version the package
allows, so an upgrade that moves an internal fails a test instead of production.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import cache
from typing import Any

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
    import redis

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


def read_reply(conn: Any) -> Any:
    """Read one reply on ``conn``, decoded as the client would (an error reply raises)."""
    return conn.read_response()


def disconnect(conn: Any) -> None:
    """Close ``conn``'s socket (a reply may be half read: it is never reused)."""
    conn.disconnect()


def _has_should_reconnect() -> bool:
    from redis.connection import Connection

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
