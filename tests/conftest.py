"""Fixtures: a throwaway Redis for the session, flushed before each test, and workers.

Set ``REDIS_URL`` to run against an existing server instead (its database is flushed).
"""

from __future__ import annotations

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

ROOT = Path(__file__).resolve().parent.parent

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
    finally:
        worker.request_stop()
        thread.join(timeout=30)
        assert not thread.is_alive(), "worker thread did not stop"
    worker.exit_code = result.get("code")


def worker_env(redis_url: str | None = None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    if redis_url:
        env["DELAYQ_TEST_REDIS_URL"] = redis_url
    env.update(extra)
    return env


def spawn_worker(*args: str, redis_url: str | None = None, **popen: Any) -> subprocess.Popen[str]:
    """``manage.py runworker ARGS`` in a new process (its stderr is piped, as text)."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", "runworker", *args],
        cwd=ROOT, env=worker_env(redis_url), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, **popen,
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

    def start(*args: str, redis_url: str | None = None) -> tuple[subprocess.Popen[str],
                                                                 OutputReader]:
        proc = spawn_worker(*args, redis_url=redis_url)
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
