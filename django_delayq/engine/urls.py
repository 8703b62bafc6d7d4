"""Redis URLs to redis-py clients: one server, a Cluster (several seeds), or Sentinel.

Every process (producers, workers, the mirror, the API, Spark executors) builds its
client here, so one URL form means the same thing everywhere:

- ``redis://``, ``rediss://``, ``unix://``: one server (redis-py's ``from_url``).
- ``redis+cluster://[[user]:password@]h1:p1,h2:p2,h3:p3/0``: a Redis Cluster reached
  through any of its seed nodes (redis-py's ``startup_nodes``), so a process started
  after one seed died still connects through another.
- ``redis+sentinel://[[user]:password@]h1:26379,h2:26379/service/db?sentinel_password=``:
  the primary of ``service`` as the sentinels name it (``Sentinel.master_for``). A
  failover moves the client to the new primary by itself; a connection to a demoted
  primary raises a connection error rather than ``READONLY``.

The ``rediss+`` forms use TLS, to the sentinels too. Query options (``ssl_cert_reqs``,
``ssl_ca_certs``...) apply as in redis-py's ``from_url``.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from .failover import watch_switches

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES, *SENTINEL_SCHEMES)
#: Query options of a Sentinel URL that are for the sentinels, not the primary.
SENTINEL_OPTIONS = ("sentinel_password", "sentinel_username")
DEFAULT_PORT = 6379
DEFAULT_SENTINEL_PORT = 26379


@dataclass(frozen=True)
class ParsedURL:
    """The parts of a multi-host URL (Cluster or Sentinel)."""

    scheme: str
    hosts: list[tuple[str, int]]
    username: str | None = None
    password: str | None = None
    #: The Sentinel service name (empty for a cluster).
    service: str = ""
    db: int = 0
    query: dict[str, str] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.scheme.startswith("rediss")

    def one_host_url(self) -> str:
        """A ``redis://`` URL for the first host, for redis-py's own option parsing
        (credentials, database and the query options other than the sentinels')."""
        auth = ""
        if self.password is not None or self.username:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password or '', safe='')}@"
        host, port = self.hosts[0]
        query = {k: v for k, v in self.query.items() if k not in SENTINEL_OPTIONS}
        tail = f"?{urlencode(query)}" if query else ""
        return f"{'rediss' if self.tls else 'redis'}://{auth}{_netloc(host)}:{port}/{self.db}{tail}"


def _netloc(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _host_port(text: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = text.partition(":")
    if not host:
        raise ValueError(f"a host is missing in {text!r}")
    if not port_text:
        return host, default_port
    if not port_text.isdecimal() or not 0 < int(port_text) < 65536:
        raise ValueError(f"the port of {host!r} is not a port number")
    return host, int(port_text)


def parse_multi_host(url: str) -> ParsedURL:
    """Split a ``redis+cluster://`` or ``redis+sentinel://`` URL into its parts.

    Raises ``ValueError`` with a message that never contains the password.
    """
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in CLUSTER_SCHEMES + SENTINEL_SCHEMES:
        raise ValueError(f"not a {' or '.join(CLUSTER_SCHEMES + SENTINEL_SCHEMES)} URL")
    parts = urlsplit(url)
    auth, at, hosts_text = parts.netloc.rpartition("@")
    username = password = None
    if at:
        user_text, colon, password_text = auth.partition(":")
        username = unquote(user_text) or None
        password = unquote(password_text) if colon else None
    sentinel = scheme in SENTINEL_SCHEMES
    default_port = DEFAULT_SENTINEL_PORT if sentinel else DEFAULT_PORT
    hosts = [_host_port(h.strip(), default_port) for h in hosts_text.split(",") if h.strip()]
    if not hosts:
        raise ValueError("no host is named")
    path = [p for p in parts.path.split("/") if p]
    service, db_text = "", "0"
    if sentinel:
        if not path:
            raise ValueError("the Sentinel service name is missing (…/mymaster/0)")
        service = unquote(path[0])
        db_text = path[1] if len(path) > 1 else "0"
        if len(path) > 2:
            raise ValueError("the path must be /service or /service/db")
    elif path:
        db_text = path[0]
        if len(path) > 1:
            raise ValueError("the path must be /db")
    if not db_text.isdecimal():
        raise ValueError("the database must be a number")
    db = int(db_text)
    if not sentinel and db != 0:
        raise ValueError("a Redis Cluster has database 0 only")
    query = dict(parse_qsl(parts.query, keep_blank_values=True))
    return ParsedURL(scheme, hosts, username, password, service, db, query)


def check_url(url: str) -> str | None:
    """What is wrong with ``url`` as a REDIS_URL (never quoting its password), or None."""
    if not isinstance(url, str):
        return f"it must be a string, not {type(url).__name__}"
    scheme = url.partition("://")[0] if "://" in url else ""
    if scheme not in SCHEMES:
        return f"its scheme must be one of {', '.join(s + '://' for s in SCHEMES)}"
    if scheme in CLUSTER_SCHEMES + SENTINEL_SCHEMES:
        try:
            parse_multi_host(url)
        except ValueError as exc:
            return str(exc)
    return None


_USERINFO = re.compile(r"[^/\s]*@")


#: Options of a URL whose values are hidden by :func:`redact` (a name containing one):
#: Redis passwords, and the credentials of object stores (``secret_key``, ``session_token``,
#: ``access_key`` of a lake URL).
SECRET_OPTIONS = ("password", "secret", "token", "key")


def redact(url: Any) -> str:
    """``url`` with its secrets (userinfo, and the options :data:`SECRET_OPTIONS` name)
    replaced by ``***``."""
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"  # it may hold anything: named by its type only
    scheme, sep, rest = url.partition("://")
    if not sep:  # not a URL (a typo such as redis//:pw@host): hide any userinfo
        return _USERINFO.sub("***@", url)
    netloc, slash, tail = rest.partition("/")
    auth, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, _ = auth.partition(":")
        netloc = f"{user}:***@{hosts}" if colon else f"***@{hosts}"
    path, q, query = tail.partition("?")
    if q:
        query = "&".join(
            f"{k}=***" if any(s in k.lower() for s in SECRET_OPTIONS) else f"{k}={v}" if eq
            else k
            for k, eq, v in (item.partition("=") for item in query.split("&"))
        )
    return f"{scheme}{sep}{netloc}{slash}{path}{q}{query}"


def client_from_url(url: str, **kwargs: Any) -> Any:
    """A redis-py client for ``url``; ``kwargs`` are connection options (timeouts...).

    A ``RedisCluster`` for a cluster URL, a Sentinel-managed ``Redis`` for a Sentinel
    URL, else a ``Redis``: the URL alone says what the server is.
    """
    scheme = url.partition("://")[0]
    if scheme in SENTINEL_SCHEMES:
        return sentinel_client(parse_multi_host(url), **kwargs)
    if scheme in CLUSTER_SCHEMES:
        kwargs.pop("health_check_interval", None)  # not an option of RedisCluster
        parsed = parse_multi_host(url)
        seeds = [ClusterNode(host, port)  # type: ignore[no-untyped-call]
                 for host, port in parsed.hosts[1:]]
        return LazyRedisCluster(redact(url), url=parsed.one_host_url(), startup_nodes=seeds,
                                **kwargs)
    return redis.Redis.from_url(url, **kwargs)


class LazyRedisCluster(RedisCluster):
    """A ``RedisCluster`` that reads the cluster's slots at its first use, not as it is
    made (redis-py's reads them in its constructor, so that a cluster with no seed
    reachable made the making of a client fail, where a client of one server connects
    at its first call). Made this way, a client is made whatever state the cluster is
    in, and a cluster with no node answering fails the calls: ``RedisClusterException``,
    which the engine words as :class:`DelayQConnectionError` and the runtime's loops
    retry, as for any Redis not answering. Thread-safe: one thread reads the slots."""

    def __init__(self, seeds: str, **options: Any) -> None:
        """``seeds``: its URL without a password (for error messages); ``options``:
        ``RedisCluster``'s (``url=``, ``startup_nodes=``...)."""
        self.__dict__.update(seeds=seeds, _lazy_options=options,
                             _lazy_lock=threading.RLock(), _lazy_state="new")

    def __getattr__(self, name: str) -> Any:
        """Called for the attributes redis-py's constructor sets: runs it on the first."""
        if name.startswith("_lazy_") or self._lazy_state == "made":
            raise AttributeError(name)  # really missing
        with self._lazy_lock:  # another thread making it: wait for it
            if self._lazy_state == "making":  # asked by the constructor, on this thread
                raise AttributeError(name)
            if self._lazy_state == "new":
                self.__dict__["_lazy_state"] = "making"
                try:
                    RedisCluster.__init__(self, **self._lazy_options)
                    self.__dict__["_lazy_state"] = "made"
                finally:
                    if self._lazy_state == "making":  # failed: try again at the next call
                        self.__dict__["_lazy_state"] = "new"
        return object.__getattribute__(self, name)

    def close(self) -> None:
        if self._lazy_state == "made":
            super().close()


def sentinel_client(parsed: ParsedURL, **kwargs: Any) -> Any:
    """The primary of ``parsed.service`` through the sentinels ``parsed.hosts``."""
    options = {**parse_url(parsed.one_host_url()), **kwargs}  # type: ignore[no-untyped-call]
    options.pop("host", None)
    options.pop("port", None)
    if options.pop("connection_class", None) is not None or parsed.tls:
        options["ssl"] = True  # the Sentinel pool picks its TLS connection class from this
    # The sentinels: their own credentials, the same TLS and socket options.
    sentinel_options = {k: v for k, v in options.items()
                        if k.startswith(("socket_", "ssl")) or k in (
                            "decode_responses", "encoding", "encoding_errors")}
    if "sentinel_password" in parsed.query:
        sentinel_options["password"] = parsed.query["sentinel_password"]
    if "sentinel_username" in parsed.query:
        sentinel_options["username"] = parsed.query["sentinel_username"]
    sentinel = Sentinel(parsed.hosts,  # type: ignore[no-untyped-call]
                        sentinel_kwargs=sentinel_options)
    client = sentinel.master_for(parsed.service, **options)  # type: ignore[no-untyped-call]
    watch_switches(client)
    return client


def sentinel_url_from_cache(location: str, options: dict[str, Any]) -> str | None:
    """The ``redis+sentinel://`` URL of a django-redis Sentinel cache (its ``LOCATION``
    ``redis://[:password@]service/db`` and ``OPTIONS["SENTINELS"]``), for processes
    that connect from a URL alone (Spark executors); None for any other cache."""
    sentinels = options.get("SENTINELS")
    if not sentinels:
        return None
    parts = urlsplit(location)
    auth = parts.netloc.rpartition("@")[0]
    hosts = ",".join(f"{_netloc(str(host))}:{int(port)}" for host, port in sentinels)
    db = parts.path.strip("/") or "0"
    scheme = "rediss+sentinel" if parts.scheme == "rediss" else "redis+sentinel"
    url = f"{scheme}://{auth + '@' if auth else ''}{hosts}/{quote(parts.hostname or '')}/{db}"
    password = (options.get("SENTINEL_KWARGS") or {}).get("password")
    return f"{url}?{urlencode({'sentinel_password': password})}" if password else url


def client_like(client: Any, **kwargs: Any) -> Any:
    """A new client on the same server (or Sentinel service) as ``client`` (a
    django-redis cache's, say), with pools of its own and ``kwargs`` over its connection
    options: a cache's clients answer in bytes and time out as the cache wants."""
    pool = client.connection_pool
    options = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    options.update(kwargs)
    if isinstance(pool, SentinelConnectionPool):
        return redis.Redis(connection_pool=SentinelConnectionPool(  # type: ignore[no-untyped-call]
            pool.service_name, pool.sentinel_manager, connection_class=pool.connection_class,
            is_master=pool.is_master, **options))
    return redis.Redis(connection_pool=redis.ConnectionPool(
        connection_class=pool.connection_class, **options))


class _Refuse(Retry):
    """A connection's retry policy that calls ``refuse`` instead of the first attempt:
    redis-py runs every connect (then every command) of a connection through its
    ``retry``, so this one stops a connection before its socket opens."""

    def __init__(self, refuse: Callable[[], Any]) -> None:
        super().__init__(NoBackoff(), 0)
        self._refuse = refuse

    def call_with_retry(self, *args: Any, **kwargs: Any) -> Any:
        return self._refuse()


def refuse_connections(client: Any, refuse: Callable[[], Any]) -> Any:
    """``client``, whose every connection calls ``refuse()`` instead of opening (the
    pytest plugin's guard: a test may not reach the Redis of the settings)."""
    # The pool makes every connection (for commands, pipelines, scripts) with these.
    client.connection_pool.connection_kwargs["retry"] = _Refuse(refuse)
    return client
