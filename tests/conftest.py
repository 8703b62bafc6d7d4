"""Fixtures: the services of the session (:mod:`tests.services`), a Redis database
flushed before each test, and workers.

Set ``REDIS_URL`` to run against an existing Redis instead (its database is flushed), and
``DELAYQ_TEST_PG_URL`` to run the PostgreSQL tests on an existing server.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests import services

ROOT = Path(__file__).resolve().parent.parent
#: Where this run's django_delayq comes from: this tree, or an installed copy (the sdist
#: test runs the tests against one). The processes the tests start import it first.
_SPEC = importlib.util.find_spec("django_delayq")
PACKAGE_HOME = Path(_SPEC.origin).parent.parent if _SPEC and _SPEC.origin else ROOT


def subprocess_path(*first: str | Path) -> str:
    """A PYTHONPATH for a process a test starts: ``first``, this run's django_delayq,
    this tree (for ``tests``), then this process's own PYTHONPATH."""
    parts = [*map(str, first), str(PACKAGE_HOME), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(dict.fromkeys(p for p in parts if p))


def pytest_configure(config: pytest.Config) -> None:
    services.start(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    services.stop()


def pytest_report_header(config: pytest.Config) -> list[str]:
    return services.header()


#: Test modules that share one costly module-scoped fixture (a SparkSession, a browser, a
#: Redis Cluster or Sentinel group) run on one xdist worker, so it starts once there. A
#: slow test of one of them stays with its module: the Redis Cluster and Sentinel tests
#: mostly wait on their servers, so they run beside the heavy group, not in it.
SHARED_FIXTURE_MODULES = {
    "test_spark": "spark", "test_lake": "spark", "test_spark_cluster": "spark-cluster",
    "test_browser": "browser", "test_browser_pages": "browser",
    "test_browser_operator": "browser",
    "test_cluster": "redis-cluster", "test_cluster_wait": "redis-cluster-wait",
    "test_sentinel": "sentinel",
}
#: The heavy tests (fault injection, soaks, the benchmark smoke run) run one at a time, on
#: one xdist worker, while the other worker runs the rest. The longest group sets the
#: suite's wall time: a slow test that mostly waits belongs in a group of its own.
HEAVY = "heavy"
#: The bound of a Spark test without one of its own. A test cut by pytest-timeout's signal
#: in the middle of a Spark call leaves its process's py4j connection out of step, and
#: every later Spark test of that process then fails with it: a hang guard, not a limit a
#: busy machine may reach (the lake's report took 90 s at a load of 8).
SPARK_TIMEOUT = 900


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for ``pytest -n N --dist loadgroup``, give the Spark tests their
    hang guard (:data:`SPARK_TIMEOUT`), and start PostgreSQL if needed."""
    for item in items:
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
        if item.get_closest_marker("spark") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SPARK_TIMEOUT))
        if item.get_closest_marker("xdist_group"):
            continue
        if module in SHARED_FIXTURE_MODULES:
            item.add_marker(pytest.mark.xdist_group(SHARED_FIXTURE_MODULES[module]))
        elif item.get_closest_marker("slow") or module == "test_bench_smoke":
            item.add_marker(pytest.mark.xdist_group(HEAVY))
    if config.getoption("loadgroup", False) and hasattr(items[0] if items else None, "_id"):
        _suffix_groups(items)
    if any(item.get_closest_marker("postgres") for item in items):
        services.start_postgres()


def _suffix_groups(items: list[pytest.Item]) -> None:
    """Name each grouped test ``nodeid@group``, as pytest-xdist does to schedule a group on
    one worker. pytest-xdist 3.8 writes ``item._nodeid``, which pytest 9 no longer reads
    (a node's id lives in ``_id``): without this, groups would be silently ignored."""
    from _pytest.nodeid import coerce_node_id

    for item in items:
        groups = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                         for mark in item.iter_markers("xdist_group")})
        if groups and "@" not in item.nodeid.rsplit("::", 1)[-1]:
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")


def pytest_report_collectionfinish(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """The PostgreSQL line, when it was started after the header was printed."""
    session = services.SESSION
    return [f"  {session.pg_note}"] if session.pg_note and not session.pg_in_header else []


@pytest.fixture(scope="session", autouse=True)
def _modules_imported() -> None:
    """Every module of the package and the test app imported here, in the main thread,
    before any test starts a thread. pytest rewrites them as it imports them (the
    package is a pytest plugin's distribution), and CPython 3.11's AST builder keeps its
    recursion depth in state the threads share: a module imported for the first time in
    a worker thread while the main thread imports another failed one at random with
    ``SystemError: AST constructor recursion depth mismatch`` (cpython#106905)."""
    import importlib
    import pkgutil

    import django_delayq
    import tests.testapp

    for package in (django_delayq, tests.testapp):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            try:
                importlib.import_module(module.name)
            except ImportError as exc:  # an optional extra this environment leaves out
                if (exc.name or "").startswith(("django_delayq", "tests")):
                    raise


@pytest.fixture(autouse=True)
def _clean_redis(settings: Any) -> Iterator[None]:
    """Each test starts with an empty Redis database and fresh connections."""
    from django_delayq import connection

    connection.reset()
    broker = connection.get_broker()
    try:
        broker.client.flushdb()
    except Exception as exc:
        pytest.fail(f"the test Redis at {os.environ['DELAYQ_TEST_REDIS_URL']} is not "
                    f"reachable: {exc}")
    yield
    connection.reset()


@pytest.fixture
def broker() -> Any:
    from django_delayq.connection import get_broker

    return get_broker()


@pytest.fixture
def redis_client(broker: Any) -> Any:
    return broker.client


def system_checks() -> list[Any]:
    """Every system check message, the database checks left out: Django 6.1's
    ``run_checks()`` checks the models against every database when none is named, which a
    test without database access refuses (the project's own checks need none)."""
    from django.core.checks import run_checks

    return run_checks(databases=[])


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.02,
               message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout``. The
    default is long: a worker process on a loaded machine can take ten seconds to start,
    and a passing test never waits it out."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


#: What redis-py sends to keep a connection: on opening it (``on_connect``), and its
#: health check.
UPKEEP = {"HELLO", "AUTH", "CLIENT", "SELECT", "READONLY", "PING"}


@contextmanager
def round_trips(every_thread: bool = False) -> Iterator[list[str]]:
    """Record the round trips this thread makes to Redis inside the block (a worker
    thread's are not counted; with ``every_thread``, those of all this process's
    threads, as some bulk enqueues send their chunks from a thread of their own): each write
    of commands (one command, or a whole pipeline) to any connection is one; the list
    holds the start of each. A connection's upkeep is not counted: the handshake of a
    new one (the pool opens one whenever another thread, a worker thread of the test,
    holds the others) and the health check's PING of one idle for 30 s
    (``health_check_interval``) say nothing of the code."""
    from redis.connection import AbstractConnection

    from django_delayq.engine import pinned

    sent: list[str] = []
    original = AbstractConnection.send_packed_command
    on_open_socket = pinned.send_on_open_socket  # a bulk call's pipelined chunks
    me = threading.get_ident()

    def record(command: Any) -> None:
        if every_thread or threading.get_ident() == me:
            first = command[0] if isinstance(command, list) and command else command
            text = " ".join(bytes(first)[:80].decode(errors="replace").split())
            words = text.split(" ")  # "*<n> $<len> <COMMAND> ..."
            if len(words) < 3 or words[2] not in UPKEEP:
                sent.append(text)

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        record(command)
        original(self, command, check_health)

    def counted_on_open_socket(conn: Any, packed: list[bytes]) -> None:
        record(packed)
        on_open_socket(conn, packed)

    AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    pinned.send_on_open_socket = counted_on_open_socket
    try:
        yield sent
    finally:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
        pinned.send_on_open_socket = on_open_socket


def ran(client: Any) -> list[dict[str, Any]]:
    """What the test tasks noted, in order."""
    return [json.loads(x) for x in client.lrange("test:ran", 0, -1)]


@contextmanager
def worker_thread(**kwargs: Any) -> Iterator[Any]:
    """A :class:`Worker` running in a thread of the test process."""
    from django_delayq.worker import Worker

    worker = Worker(**kwargs)
    result: dict[str, int] = {}
    thread = threading.Thread(target=lambda: result.setdefault("code", worker.run()),
                              daemon=True)
    thread.start()
    try:
        yield worker
    except BaseException:
        # Stop the worker but let the test's own failure be the one reported.
        worker.request_stop()
        thread.join(timeout=30)
        raise
    worker.request_stop()
    thread.join(timeout=30)
    assert not thread.is_alive(), "worker thread did not stop"
    worker.exit_code = result.get("code")


def worker_env(redis_url: str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = subprocess_path()
    if redis_url:
        env["DELAYQ_TEST_REDIS_URL"] = redis_url
    env.update(extra)
    return env


def rerun_on_postgresql(test_file: str, *, this_test: str, timeout: float = 900) -> str:
    """Run ``test_file`` again in a pytest of its own on the PostgreSQL settings (less
    ``this_test``, the test calling this), and fail unless every test of it passed."""
    from django.db import connection

    if connection.vendor == "postgresql":
        pytest.fail("run this test with the default (SQLite) settings; it starts PostgreSQL runs")
    import psycopg

    try:
        psycopg.connect(services.pg_admin_dsn(), connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {services.pg_where()} (trust auth), and "
                    f"{test_file} must also pass on PostgreSQL: unset DELAYQ_TEST_PG_URL to "
                    f"let the suite start its own. {exc}")
    # A process group of its own, killed whole at the end: if this test is stopped (its
    # timeout), the processes the inner tests started die with it rather than live on
    # against this worker's Redis.
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "--ds=tests.settings_postgres", "-p", "no:cacheprovider",
         "-q", test_file, "-k", f"not {this_test}"],
        cwd=ROOT, env=worker_env(DJANGO_SETTINGS_MODULE="tests.settings_postgres"),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        output, _ = run.communicate(timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert run.returncode == 0, output
    assert " passed" in output, output
    assert "skipped" not in output, output
    assert "failed" not in output, output
    return output


def run_bench_script(name: str, *args: str, out: Path) -> dict[str, Any]:
    """Run ``python -m bench.<name> ARGS --out OUT`` as ``make bench`` does, on the
    suite's PostgreSQL, fail unless it succeeds, and return its results file."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["DELAYQ_BENCH_PG"] = ":".join(services.pg_conninfo())
    done = subprocess.run([sys.executable, "-m", f"bench.{name}", *args, "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
                          check=False)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    data: dict[str, Any] = json.loads((out / f"{name}.json").read_text())
    assert data["benchmark"] == name
    assert data["environment"]["load_average_start"]
    return data


#: ``python -c`` that sets SIGHUP's disposition (argv[1]: "ignored" or "default") and runs
#: ``python -m django`` with the rest of argv.
_HUP_START = ("import runpy, signal, sys; "
              "signal.signal(signal.SIGHUP, signal.SIG_IGN if sys.argv.pop(1) == 'ignored' "
              "else signal.SIG_DFL); runpy.run_module('django', run_name='__main__', "
              "alter_sys=True)")


def spawn_worker(*args: str, redis_url: str | None = None, env: dict[str, str] | None = None,
                 hup_ignored: bool | None = None, **popen: Any) -> subprocess.Popen[str]:
    """``manage.py runworker ARGS`` in a new process (its stderr is piped, as text);
    ``env`` adds environment variables (DELAYQ_TEST_SETTINGS...). ``hup_ignored`` starts
    it with SIGHUP ignored (as ``nohup`` does) or not, whatever this process inherited
    (a suite run under ``nohup`` passes SIGHUP's SIG_IGN on to every child); None keeps
    the inherited one."""
    python = [sys.executable, "-m", "django"]
    if hup_ignored is not None:
        python = [sys.executable, "-c", _HUP_START, "ignored" if hup_ignored else "default"]
    return subprocess.Popen(
        [*python, "runworker", *args],
        cwd=ROOT, env=worker_env(redis_url, **(env or {})), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, **popen,
    )


def worker_pids(out: OutputReader, count: int = 1, timeout: float = 60.0) -> list[int]:
    """The pids of the worker processes a ``runworker`` (``out``: its output) started, the
    first ``count`` of them (waited for)."""
    wait_until(lambda: out.text.count("pid=") and len(_started(out)) >= count, timeout,
               message=f"{count} worker process(es) to start:\n{out.text}")
    return _started(out)[:count]


def _started(out: OutputReader) -> list[int]:
    return [int(line.split(" pid=")[1].split()[0]) for line in list(out.lines)
            if "started worker-" in line]


class OutputReader:
    """Collects a process's output on a thread, so tests can wait for a line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._lines: list[str] = []
        self._process = process
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self._drained = False

    def _read(self) -> None:
        assert self._process.stdout is not None
        with self._process.stdout as stream:  # closed at EOF: no pipe left to the collector
            for line in stream:
                self._lines.append(line)

    @property
    def lines(self) -> list[str]:
        """The lines so far; every line once the process has exited (the process ending
        does not mean this reader's thread has read its last lines yet)."""
        if not self._drained and self._process.poll() is not None:
            self._drained = True
            self._thread.join(timeout=10)  # a child left holding the pipe: no EOF to await
        return self._lines

    def wait_for(self, *texts: str, timeout: float = 60.0) -> str:
        """The first line holding one of ``texts``, once the process has written it."""
        return wait_until(lambda: next((x for x in self.lines if any(t in x for t in texts)),
                                       None), timeout,
                          message=f"{' or '.join(map(repr, texts))} in worker output:\n"
                                  f"{self.text}")

    @property
    def text(self) -> str:
        return "".join(self.lines)


@pytest.fixture
def spawned() -> Iterator[Callable[..., tuple[subprocess.Popen[str], OutputReader]]]:
    """Start worker processes; every one still running at the end is killed, with its
    children (a mirror process outlives a killed parent for a while, and would mirror
    against the next test's Redis)."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, redis_url: str | None = None, env: dict[str, str] | None = None,
              hup_ignored: bool | None = None) -> tuple[subprocess.Popen[str], OutputReader]:
        proc = spawn_worker(*args, redis_url=redis_url, env=env, hup_ignored=hup_ignored)
        procs.append(proc)
        return proc, OutputReader(proc)

    yield start
    for proc in procs:
        if proc.poll() is None:
            kill_with_children(proc)


def migrated_sqlite(tmp_path: Path) -> str:
    """A migrated SQLite database file for the processes a test starts."""
    db = str(tmp_path / "jobs.sqlite3")
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT,
                   env=worker_env(DELAYQ_TEST_SQLITE=db), check=True, timeout=120)
    return db


def sqlite_query(db: str, sql: str) -> list[Any]:
    """Rows of ``sql`` as the test's worker processes wrote them; the connection is closed
    (``with sqlite3.connect()`` alone only commits)."""
    with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
        return conn.execute(sql).fetchall()


def sqlite_rows(db: str) -> dict[str, str]:
    return dict(sqlite_query(db, "SELECT job_id, status FROM django_delayq_job"))


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its re-parented init) is not alive
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def stop_during_a_job(proc: subprocess.Popen[str], out: OutputReader, client: Any, *,
                      stopping: str, gate: str, signum: int = signal.SIGTERM) -> list[str]:
    """SIGTERM ``proc``, open ``gate`` (the job it runs then ends during the warm stop) once
    it logs ``stopping``, and return its output lines once it has exited 0."""
    proc.send_signal(signum)
    out.wait_for(stopping)
    client.set(gate, 1)
    assert proc.wait(timeout=60) == 0, out.text
    return out.lines


def first_line(lines: list[str], text: str) -> int:
    """The index of the first of ``lines`` holding ``text``."""
    return next(i for i, line in enumerate(lines) if text in line)


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return found


def kill_with_children(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL ``proc`` and its children (runworker's mirror process) at once, as when
    their machine or container dies. Stopped first, it starts no child meanwhile."""
    os.kill(proc.pid, signal.SIGSTOP)
    for pid in [proc.pid, *child_pids(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


FAULT_ROWS: list[tuple[str, int, int, int]] = []


@pytest.fixture(scope="session")
def fault_report() -> Callable[[str, int, int, int], None]:
    """Note a row of the fault summary: (fault tried, jobs, lost, duplicated)."""

    def note(fault: str, jobs: int, lost: int, duplicated: int) -> None:
        FAULT_ROWS.append((fault, jobs, lost, duplicated))

    return note


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FAULT_ROWS:
        return
    width = max(len(row[0]) for row in FAULT_ROWS)
    terminalreporter.section("fault summary")
    terminalreporter.write_line(f"{'fault tried':<{width}}  {'jobs':>6}  {'lost':>4}  "
                                f"{'duplicated':>10}")
    for fault, jobs, lost, duplicated in FAULT_ROWS:
        terminalreporter.write_line(f"{fault:<{width}}  {jobs:>6}  {lost:>4}  {duplicated:>10}")
