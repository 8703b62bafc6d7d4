"""Redis not serving a call, in one place: which redis-py errors mean that (plain,
Sentinel and Cluster clients alike), which mean "not now" rather than "never", how the
engine words them (the address, never a password), and how long an enqueue tries again.
Nothing outside the engine names a redis-py error: the runtime's loops catch
:data:`CALL_FAILED`, the outbox asks :func:`is_transient`.

An enqueue keeps its job id across tries, so a retry after a call that landed finds the
job and cannot add it twice: that is what makes retrying through a failover safe.
"""

from __future__ import annotations

import logging
import re
import threading
import time
import weakref
from typing import Any

from redis.exceptions import (
    ClusterError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.sentinel import MasterNotFoundError

from .backoff import backoff_delay
from .errors import DelayQConnectionError, DelayQError, NotReplicated
from .logfields import log

#: redis-py errors that mean Redis did not serve a call, not that the call was wrong.
#: (``RedisClusterException``, which is not a ``RedisError``, is what redis-py raises when
#: no node of a cluster answers; the engine never sends what it raises for misuse, such
#: as keys of several slots in one call.)
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, ClusterError, TryAgainError,
               RedisClusterException)
#: Errors after which an enqueue may be retried with the same job id: Redis did not
#: serve it, or a demoted primary refused it (``READONLY``).
FAILOVER = (*UNAVAILABLE, ReadOnlyError)
#: Every way a call to Redis can fail, as a loop that must go on catches it: Redis did
#: not serve it (:data:`UNAVAILABLE`), answered with an error, or the engine said so in
#: its own terms (:class:`DelayQError`).
CALL_FAILED = (RedisError, RedisClusterException, DelayQError)
#: Redis answered the call with an error of its own (a refused command, a key of another
#: type, a script's error): the call was wrong, or Redis cannot take it now
#: (:func:`is_transient` tells which).
REFUSED = (ResponseError,)
#: Answers of a Redis that cannot write for now (memory full, a replica, loading, its
#: last snapshot failed under ``stop-writes-on-bgsave-error``...):
#: redis-py raises a class of its own for some (their message then lacks the code), a
#: plain ``ResponseError`` whose message starts with the code for the others.
TRANSIENT_REPLY_CLASSES = (OutOfMemoryError, ReadOnlyError)
TRANSIENT_REPLIES = ("OOM", "BUSY", "LOADING", "MASTERDOWN", "NOREPLICAS", "READONLY",
                     "TRYAGAIN", "CLUSTERDOWN", "MISCONF")
#: Seconds between the tries of an enqueue through a failover.
FAILOVER_INTERVAL = 0.2

logger = logging.getLogger(__name__)


def describe(client: Any) -> str:
    """The Redis address of ``client`` for error messages, never with its password."""
    seeds = vars(client).get("seeds") if hasattr(client, "__dict__") else None
    if isinstance(seeds, str):  # a Cluster client (engine/urls.py), made or not
        return seeds
    try:
        pool = client.connection_pool
        kw = pool.connection_kwargs
    except AttributeError:
        return "the configured Redis"
    service = getattr(pool, "service_name", None)
    if service is not None:  # a Sentinel pool: the service, and the primary last known
        address = getattr(getattr(pool, "proxy", None), "master_address", None)
        where = f" (primary {address[0]}:{address[1]})" if address else ""
        return f"the Sentinel service {service!r}{where}, db {kw.get('db', 0)},"
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    # A rediss:// URL shows in the connection class, not always in the kwargs.
    tls = (kw.get("ssl") or any(k.startswith("ssl_") for k in kw)
           or "SSL" in getattr(getattr(pool, "connection_class", None), "__name__", ""))
    scheme = "rediss" if tls else "redis"
    return f"{scheme}://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


def unreachable(client: Any, exc: Exception) -> DelayQConnectionError:
    """The error a caller sees for ``exc`` of :data:`FAILOVER`, with ``client``'s address."""
    if type(exc) is RedisClusterException:  # what redis-py raises when no node answers
        return DelayQConnectionError(
            f"the Redis Cluster at {describe(client)} is unreachable: no node answered "
            f"({exc})")
    if isinstance(exc, ClusterError | TryAgainError | RedisClusterException):
        return DelayQConnectionError(
            f"the Redis Cluster at {describe(client)} did not serve the call (a "
            f"slot moving between nodes answers TRYAGAIN until the move ends; a failover "
            f"takes seconds): {exc}")
    if isinstance(exc, ReadOnlyError):
        return DelayQConnectionError(
            f"Redis at {describe(client)} is a replica now (a failover demoted "
            f"it) and refused the write: {exc}")
    if isinstance(exc, MasterNotFoundError):  # its message lists each sentinel's client
        return DelayQConnectionError(
            f"Redis at {describe(client)} is unreachable: no sentinel named its primary "
            f"(the sentinels are down or unreachable, or none knows the service)")
    return DelayQConnectionError(f"Redis at {describe(client)} is unreachable: {exc}")


def retry_or_raise(client: Any, retry_ms: int, exc: Exception, deadline: float | None) -> float:
    """After a failed try of an enqueue: wait a little and return the retry deadline
    (``retry_ms`` after the first failure), or raise :func:`unreachable` once it passed."""
    now = time.monotonic()
    if deadline is None:
        deadline = now + retry_ms / 1000
    if now >= deadline:
        raise unreachable(client, exc) from exc
    log(logger, logging.DEBUG, "Redis unavailable, retrying the enqueue", error=exc)
    time.sleep(min(FAILOVER_INTERVAL, max(0.0, deadline - now)))
    return deadline


class PrimaryMoved(RedisConnectionError):
    """Replicas confirmed a write (``WAIT``) on a primary that the sentinels no longer
    all name, or that one of them is failing over: the write may be dropped when that
    primary is demoted. It is sent again (its job ids make that safe) once every
    connection to it is closed."""


def drop_demoted(client: Any, pinned: Any = None) -> None:
    """Close every connection of ``client`` (and its ``pinned`` ones), so the next call
    connects again and reaches the primary as it is named now: after ``READONLY`` (a
    managed service moved its address to a new primary) or :class:`PrimaryMoved`."""
    if pinned is not None:
        pinned.close()
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.disconnect()


def follow_primary(client: Any, pinned: Any = None) -> None:
    """After a write replicas confirmed, on a Sentinel client: raise
    :class:`PrimaryMoved` (its connections closed) unless every sentinel that answers
    names the primary the client last connected to, with no failover under way.

    Why: ``SENTINEL FAILOVER`` (or a failover while the old primary still answers)
    promotes a replica at once, but the old primary takes writes until a sentinel
    demotes it seconds later, and then drops them; its other replicas confirm its
    ``WAIT`` meanwhile. Asking the sentinels after the ``WAIT`` closes that gap: a
    sentinel names the new primary (or says a failover is under way) from the moment
    the promoted replica acts as one. Costs one round trip per sentinel, for durable
    writes (``MIN_REPLICAS``) on a Sentinel URL only. With no sentinel answering, the
    write stands on its ``WAIT`` alone. A metrics scrape asks the same after its read
    (:func:`~.overview.summaries`), so it never shows totals the new primary lacks.
    """
    pool = getattr(client, "connection_pool", None)
    manager = getattr(pool, "sentinel_manager", None)
    if pool is None or manager is None:
        return
    known = getattr(getattr(pool, "proxy", None), "master_address", None)
    for sentinel in manager.sentinels:
        try:
            state = sentinel.sentinel_master(pool.service_name)
        except (RedisConnectionError, RedisTimeoutError, ResponseError):
            continue
        named = (str(state["ip"]), int(state["port"]))
        if "failover_in_progress" in str(state.get("flags", "")) or (
                known is not None and named != (str(known[0]), int(known[1]))):
            drop_demoted(client, pinned)
            raise PrimaryMoved(f"the sentinels name another primary than {known[0]}:"
                               f"{known[1]} or fail it over" if known else
                               "a sentinel is failing the primary over")


#: Per connection pool, what keeps connections of its own out of it (the pinned ones of
#: :mod:`.pinned`): told of each switch, they close the idle ones and those in flight.
_HOLDERS: weakref.WeakKeyDictionary[Any, weakref.WeakSet[Any]] = weakref.WeakKeyDictionary()


def hold_connections(pool: Any, holder: Any) -> None:
    """Have ``holder.switched()`` called when the sentinels switch ``pool``'s primary."""
    _HOLDERS.setdefault(pool, weakref.WeakSet()).add(holder)


def watch_switches(client: Any) -> None:
    """Follow the sentinels' ``+switch-master`` messages for ``client``'s service on a
    daemon thread: each closes the client's idle connections and has the pinned ones
    (:func:`hold_connections`) closed as they come back, so no call goes on reaching a
    demoted primary that still answers, and the next ones connect to the primary the
    sentinels name. A sentinel that fails hands over to the next; the thread ends once
    the client is gone."""
    pool = client.connection_pool
    manager = pool.sentinel_manager
    service, sentinels = pool.service_name, list(manager.sentinels)
    ref = weakref.ref(client)

    def follow() -> None:
        failures = 0
        while ref() is not None:
            sentinel = sentinels[failures % len(sentinels)]
            try:
                with sentinel.pubsub(ignore_subscribe_messages=True) as pubsub:
                    pubsub.subscribe("+switch-master")
                    failures = 0
                    while (live := ref()) is not None:
                        del live
                        message = pubsub.get_message(timeout=1.0)
                        data = str((message or {}).get("data") or "")
                        if data.split(" ", 1)[0] == service and (live := ref()) is not None:
                            log(logger, logging.WARNING, "the sentinels switched the "
                                "primary, reconnecting", service=service, switch=data)
                            # Asked first from now on: the others may name the old
                            # primary a little longer, and redis-py takes the first
                            # answer when it connects again.
                            manager.sentinels[:] = [sentinel, *(
                                s for s in manager.sentinels if s is not sentinel)]
                            # Idle connections only: closing one another thread is
                            # sending on would break its call with a bare socket error.
                            # A durable write on one still open is checked after its
                            # WAIT (follow_primary) and sent again.
                            live.connection_pool.disconnect(inuse_connections=False)
                            for holder in list(_HOLDERS.get(live.connection_pool, ())):
                                holder.switched()
                            del live
            except (RedisError, OSError, ValueError):
                failures += 1
                time.sleep(backoff_delay(failures, first=0.1, cap=5.0))

    threading.Thread(target=follow, name=f"delayq-sentinel-{service}", daemon=True).start()


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` means "Redis cannot take it now" rather than "never".

    ``NotReplicated`` (fewer replicas than ``MIN_REPLICAS`` confirmed) counts: what was
    sent may be sent again, and an id adds no job twice.
    """
    exc = in_script(exc)
    if isinstance(exc, (DelayQConnectionError, NotReplicated, *UNAVAILABLE,
                        *TRANSIENT_REPLY_CLASSES)):
        return True
    return isinstance(exc, ResponseError) and str(exc).startswith(TRANSIENT_REPLIES)


#: How Redis before 7 words an error a command of a script answered: within the
#: script's, e.g. "Error running script (call to f_<sha>): @user_script:1: @user_script:
#: 1: -OOM command not allowed ...". Redis 7 answers the command's own ("OOM ...").
_IN_SCRIPT = re.compile(r"Error running script \(call to f_[0-9a-f]+\): .*?: -([A-Z]+ .*)",
                        re.DOTALL)
#: The errors of a script's command that redis-py raises as their own class.
_SCRIPT_ERROR_CLASSES: dict[str, type[ResponseError]] = {
    "OOM": OutOfMemoryError, "READONLY": ReadOnlyError}


def in_script(exc: BaseException) -> BaseException:
    """``exc`` as Redis 7 gives it when a command of a script failed: on Redis 6.2 the
    script's error wraps the command's, and an ``OOM`` or ``READONLY`` (not now) would
    read as a script's error (never)."""
    if type(exc) is not ResponseError:
        return exc
    found = _IN_SCRIPT.match(str(exc))
    if found is None:
        return exc
    reply = found[1]
    return _SCRIPT_ERROR_CLASSES.get(reply.split(" ", 1)[0], ResponseError)(reply)
