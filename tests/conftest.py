"""Fixtures: the services of the session (:mod:`tests.services`), a Redis database
flushed before each test, and workers.

Set ``REDIS_URL`` to run against an existing Redis instead (its database is flushed), and
``DELAYQ_TEST_PG_URL`` to run the PostgreSQL tests on an existing server.
"""

from __future__ import annotations

import importlib.util
import json
import os
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


#: Test modules that share one costly module-scoped fixture (a SparkSession, a browser)
#: run on one xdist worker, so it starts once.
SHARED_FIXTURE_MODULES = {"test_spark": "spark", "test_lake": "spark", "test_browser": "browser",
                          "test_spark_cluster": "spark-cluster"}
#: The heavy tests (fault injection, soaks, the benchmark smoke run) run one at a time, on
#: one xdist worker, while the other worker runs the rest.
HEAVY = "heavy"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for ``pytest -n N --dist loadgroup``; start PostgreSQL if needed."""
    for item in items:
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1].removesuffix(".py")
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


def wait_until(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.02,
               message: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {message}")
        time.sleep(interval)


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
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "--ds=tests.settings_postgres", "-p", "no:cacheprovider",
         "-q", test_file, "-k", f"not {this_test}"],
        cwd=ROOT, env=worker_env(DJANGO_SETTINGS_MODULE="tests.settings_postgres"),
        capture_output=True, text=True, timeout=timeout,
    )
    output = run.stdout + run.stderr
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


def spawn_worker(*args: str, redis_url: str | None = None, env: dict[str, str] | None = None,
                 **popen: Any) -> subprocess.Popen[str]:
    """``manage.py runworker ARGS`` in a new process (its stderr is piped, as text);
    ``env`` adds environment variables (DELAYQ_TEST_SETTINGS...)."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", "runworker", *args],
        cwd=ROOT, env=worker_env(redis_url, **(env or {})), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, **popen,
    )


class OutputReader:
    """Collects a process's output on a thread, so tests can wait for a line."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._process = process
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 20.0) -> str:
        return wait_until(lambda: next((x for x in self.lines if text in x), None), timeout,
                          message=f"{text!r} in worker output:\n{self.text}")

    @property
    def text(self) -> str:
        return "".join(self.lines)


@pytest.fixture
def spawned() -> Iterator[Callable[..., tuple[subprocess.Popen[str], OutputReader]]]:
    """Start worker processes; every one still running at the end is killed."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, redis_url: str | None = None,
              env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], OutputReader]:
        proc = spawn_worker(*args, redis_url=redis_url, env=env)
        procs.append(proc)
        return proc, OutputReader(proc)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
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
