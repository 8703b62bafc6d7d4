"""Tasks the tests enqueue. They report to Redis, so tests in another process see them."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
import time
import warnings

from django_delayq import task
from django_delayq.connection import get_broker

RAN = "test:ran"


def _client():
    return get_broker().client


def _note(name: str, **data: object) -> None:
    seconds, micros = _client().time()
    data.update(task=name, pid=os.getpid(), redis_ms=int(seconds) * 1000 + int(micros) // 1000)
    _client().rpush(RAN, json.dumps(data))


def _wait_for(gate: str) -> None:
    """Wait (at most 60 s) until the key ``gate`` exists."""
    deadline = time.monotonic() + 60
    while not _client().exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        time.sleep(0.02)


@task
def record(tag: str, *, extra: object = None) -> str:
    """Note that it ran, and return its tag."""
    _note("record", tag=tag, extra=extra)
    return tag


@task
def take_anything(*args: object, **kwargs: object) -> None:
    """Takes any arguments: the codec tests compare what producers store."""


@task
def sends_record(tag: str) -> str:
    """Enqueue ``record(tag)`` from inside a job; returns the new job's id."""
    return record.enqueue(tag).id


@task(queue="other")
def record_other(tag: str) -> str:
    _note("record_other", tag=tag)
    return tag


@task(max_attempts=3, retry_backoff=0.2, retry_backoff_max=1.0)
def always_fails(tag: str) -> None:
    _note("always_fails", tag=tag)
    raise RuntimeError(f"boom {tag}")


@task(max_attempts=1)
def returns_unjsonable() -> object:
    return object()


@task(max_attempts=2)
def gated(tag: str, gate: str) -> str:
    """Note that it started, then wait (at most 60 s) until the key ``gate`` exists."""
    _note("gated-start", tag=tag)
    deadline = time.monotonic() + 60
    while not _client().exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        time.sleep(0.02)
    _note("gated-end", tag=tag)
    return tag


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def count_run(tag: str, seconds: float = 0.0) -> None:
    """Count a run in the hash ``test:count`` (a field per tag), after ``seconds`` of work."""
    if seconds:
        time.sleep(seconds)
    _client().hincrby("test:count", tag, 1)


if os.environ.get("DELAYQ_TEST_PERIODIC"):
    # Only in the worker processes of the periodic-task tests: every other worker would
    # otherwise schedule it too.
    @task(name="tests.periodic_tick", queue="periodic",
          every=float(os.environ["DELAYQ_TEST_PERIODIC"]))
    def periodic_tick() -> None:
        _note("periodic_tick")


# Tasks written against Django's Tasks API, found by workers through this module, and the
# tasks of the fault and bad-input tests.
from . import (  # noqa: E402, F401
    fault_tasks,
    flow_hooks,
    keyed_tasks,
    outbox_hooks,
    port_tasks,
    soak_tasks,
    standard_tasks,
)


@task
def connection_health_checked() -> bool:
    """Whether Django's default connection counts as health-checked when the job starts."""
    from django.db import connection

    return connection.health_check_done


@task
def queries_database() -> None:
    """Query through the default connection, opening it if need be, and leave it marked
    as health-checked (what a check after the job unmarks)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    connection.health_check_done = True


class LibraryAbort(BaseException):
    """A library's own BaseException subclass (not an Exception)."""


class Unprintable(Exception):
    """An exception whose ``__str__`` and ``__repr__`` raise."""

    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __repr__(self) -> str:
        raise RuntimeError("no repr either")


BASE_EXCEPTIONS = {
    "SystemExit": lambda: SystemExit(3),
    "KeyboardInterrupt": lambda: KeyboardInterrupt(),
    "GeneratorExit": lambda: GeneratorExit(),
    "LibraryAbort": lambda: LibraryAbort("abort!"),
    "Unprintable": lambda: Unprintable(object()),
}


@task(max_attempts=1)
def raises(kind: str) -> None:
    """Raise the exception named ``kind`` (a key of BASE_EXCEPTIONS)."""
    _note("raises", kind=kind)
    raise BASE_EXCEPTIONS[kind]()


_PROMETHEUS: dict[str, object] = {}


@task
def counts_in_prometheus(tag: str) -> str:
    """Count the job in a prometheus_client counter and mark this process busy in a live
    gauge (the pool's multiprocess mode collects both); note the pid."""
    from prometheus_client import Counter, Gauge

    if not _PROMETHEUS:
        _PROMETHEUS["jobs"] = Counter("tests_jobs_counted", "Jobs counted by the task.")
        _PROMETHEUS["alive"] = Gauge("tests_processes_counting", "Processes that counted.",
                                     multiprocess_mode="livesum")
    _PROMETHEUS["jobs"].inc()  # type: ignore[attr-defined]
    _PROMETHEUS["alive"].set(1)  # type: ignore[attr-defined]
    _note("counts_in_prometheus", tag=tag)
    return tag


@task(max_attempts=1)
def raises_value_error(message: str) -> None:
    raise ValueError(message)


@task(max_attempts=2, retry_backoff=0.1, retry_backoff_max=0.1)
def raises_then_records(kind: str) -> str:
    """Raise ``kind`` on the first attempt, succeed on the second."""
    from django_delayq.current import current_job

    running = current_job()
    assert running is not None
    _note("raises_then_records", kind=kind, attempt=running.job.attempt)
    if running.job.attempt == 1:
        raise BASE_EXCEPTIONS[kind]()
    return kind


@task(max_attempts=2)
def exits_process(tag: str) -> None:
    """Kill the whole worker process at once on the first attempt (no cleanup at all)."""
    from django_delayq.current import current_job

    running = current_job()
    assert running is not None
    _note("exits_process", tag=tag, attempt=running.job.attempt)
    if running.job.attempt == 1:
        os._exit(7)


def _attempt() -> int:
    from django_delayq.current import current_job

    running = current_job()
    return running.job.attempt if running is not None else 0


@task(timeout=0.5, max_attempts=2, retry_backoff=0.1, retry_backoff_max=0.1)
def never_returns(tag: str) -> None:
    """Loop for ever (in Python, sleeping in short C calls): the soft limit stops it."""
    _note("never_returns", tag=tag, attempt=_attempt())
    while True:
        time.sleep(0.02)


@task(timeout=0.5, max_attempts=1)
def swallows_timeout(tag: str) -> None:
    """Catch every exception, JobTimeout included, and go on: only the hard limit ends it."""
    _note("swallows_timeout", tag=tag, attempt=_attempt())
    while True:
        try:
            while True:
                time.sleep(0.02)
        except BaseException as exc:
            _note("swallowed", tag=tag, error=type(exc).__name__)


@task(timeout=0.5, max_attempts=1)
def blocks_in_c(tag: str) -> None:
    """Sleep in one C call far past the limit: the soft limit cannot reach it."""
    _note("blocks_in_c", tag=tag)
    time.sleep(3600)
    _note("blocks_in_c-end", tag=tag)


#: A catastrophic backtracking: one C call (hours long) that holds the GIL throughout.
GIL_PATTERN, GIL_SUBJECT = r"(a+)+$", "a" * 40 + "b"


@task(timeout=0.5, max_attempts=1)
def holds_gil(tag: str) -> bool:
    """Match a regex that holds the GIL far past the limit: no other thread of the
    process (its watchdog, heartbeat, signal handlers) runs until it returns."""
    _note("holds_gil", tag=tag)
    return re.match(GIL_PATTERN, GIL_SUBJECT) is not None


@task(max_attempts=1)
def holds_gil_unlimited(tag: str) -> bool:
    """:func:`holds_gil` with no time limit."""
    _note("holds_gil_unlimited", tag=tag)
    return re.match(GIL_PATTERN, GIL_SUBJECT) is not None


@task(max_attempts=1)
def sleeps(seconds: float) -> float:
    """Sleep ``seconds`` (a task with no time limit of its own)."""
    _note("sleeps", seconds=seconds)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.02)
    return seconds


@task(max_attempts=1)
def winds_down_when_aborted(tag: str, cleanup_s: float) -> str:
    """Work until JobAborted is raised in it, then clean up for ``cleanup_s`` seconds
    (within the abort's grace) and return."""
    from django_delayq import JobAborted

    _note("winds_down_when_aborted", tag=tag)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            time.sleep(0.02)
    except JobAborted:
        deadline = time.monotonic() + cleanup_s
        while time.monotonic() < deadline:
            time.sleep(0.02)
        _note("wound_down", tag=tag)
    return "stopped"


@task(max_attempts=3)
def stops_when_aborted(tag: str) -> str:
    """Work in steps until ``current_job().abort_requested``, then note it and return."""
    from django_delayq.current import current_job

    _note("stops_when_aborted", tag=tag)
    job = current_job()
    assert job is not None
    deadline = time.monotonic() + 300
    while not job.abort_requested and time.monotonic() < deadline:
        time.sleep(0.02)
    _note("abort_noticed", tag=tag, by=job.aborted_by)
    return "stopped"


@task(max_attempts=1)
def spin(tag: str, gate: str) -> int:
    """CPU-bound: note the start, then compute (holding the GIL) until ``gate`` exists."""
    _note("spin-start", tag=tag)
    client, loops, total = _client(), 0, 0
    deadline = time.monotonic() + 60
    while not client.exists(gate) and time.monotonic() < deadline:
        for i in range(20_000):
            total += i * i
        loops += 1
    return loops


_LEAKED: list[bytearray] = []


@task
def leak(tag: str, mib: int, hold: float = 0.0) -> None:
    """Note the run, then keep ``mib`` MiB alive until the process ends (a leak); take
    ``hold`` seconds more."""
    _LEAKED.append(bytearray(b"x" * (mib * 1024 * 1024)))
    _note("leak", tag=tag)
    time.sleep(hold)



ASYNC = "async"  # a queue of its own: workers of the other queues claim as before


@task(queue=ASYNC)
async def async_gated(tag: str, gate: str) -> str:
    """Note the start, await (asyncio.sleep) until ``gate`` exists, note the end."""
    _note("async-start", tag=tag)
    deadline = time.monotonic() + 60
    while not _client().exists(gate) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    _note("async-end", tag=tag)
    return tag


@task(queue=ASYNC, max_attempts=1)
async def async_overrun(tag: str) -> None:
    """Note the start, then await far longer than any time limit of the tests."""
    _note("async-overrun", tag=tag)
    await asyncio.sleep(300)


@task(queue=ASYNC, timeout=0.5, max_attempts=1)
async def async_blocks_loop(seconds: float) -> None:
    """Block the event loop (a sync sleep in a coroutine) far past the limit."""
    _note("async-blocks", seconds=seconds)
    time.sleep(seconds)


@task(queue=ASYNC, max_attempts=1)
async def async_blocks_loop_until(gate: str, tag: str) -> str:
    """Block the event loop (no time limit) until ``gate`` exists."""
    _note("async-blocks-until", tag=tag)
    _wait_for(gate)
    return tag


@task(queue=ASYNC, timeout=0.5, max_attempts=1)
async def async_swallows_cancel(tag: str) -> None:
    """Catch every cancellation and go on awaiting: only the hard limit ends it."""
    _note("async-swallows", tag=tag)
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            _note("async-swallowed", tag=tag)


@task(queue=ASYNC, max_attempts=2)
async def async_kills_loop(tag: str) -> str:
    """On the first attempt, end the event loop under the job (a SystemExit raised in a
    callback of the loop leaves ``run_forever``); on the second, return ``tag``."""
    attempt = _attempt()
    _note("async-kills-loop", tag=tag, attempt=attempt)
    if attempt == 1:
        asyncio.get_running_loop().call_soon(sys.exit, 3)
        await asyncio.sleep(60)
    return tag


@task(queue=ASYNC, max_attempts=1)
async def async_orm(username: str) -> int:
    """Create a user through sync_to_async (the ORM is sync-only); its primary key."""
    from asgiref.sync import sync_to_async
    from django.contrib.auth.models import User

    user = await sync_to_async(User.objects.create)(username=username)
    return user.pk


@task(queue=ASYNC, max_attempts=1)
async def async_orm_unsafe() -> int:
    """Use the ORM straight from the event loop: Django refuses."""
    from django.contrib.auth.models import User

    return User.objects.count()


@task(queue=ASYNC, max_attempts=1)
async def async_base_exception() -> None:
    raise KeyboardInterrupt("from a coroutine")


@task(queue=ASYNC, max_attempts=1)
async def async_add(a: int, b: int) -> dict[str, object]:
    """Await the loop once, report progress, return the sum and the thread's loop state."""
    from django_delayq.current import current_job

    await asyncio.sleep(0)
    running = current_job()
    assert running is not None
    running.set_progress(0.5, "half way")
    return {"sum": a + b, "in_loop": asyncio.get_running_loop().is_running()}


@task(queue=ASYNC)
async def async_flow_step(acc: int, tag: str = "") -> int:
    """:func:`flow_step` on the event loop: note it ran with ``acc``, return acc + 1."""
    await asyncio.sleep(0)
    _note("flow_step", acc=acc, tag=tag)
    return acc + 1


@task(max_attempts=1)
def reports_progress(calls: int, upto: float, message: str = "") -> int:
    """Report progress ``calls`` times in a tight loop up to ``upto``; return the writes."""
    from django_delayq.current import current_job

    running = current_job()
    assert running is not None
    return sum(running.set_progress(upto * (i + 1) / calls, message) for i in range(calls))


@task(max_attempts=1)
def progress_then_wait(fraction: float, message: str, gate: str) -> None:
    """Report ``fraction`` and ``message``, then wait (at most 60 s) for the key ``gate``."""
    from django_delayq.current import current_job

    running = current_job()
    assert running is not None
    running.set_progress(fraction, message)
    _note("progress-reported", fraction=fraction)
    _wait_for(gate)


@task(max_attempts=1)
def reports_bad_progress(fraction: object) -> None:
    from django_delayq.current import current_job

    running = current_job()
    assert running is not None
    running.set_progress(fraction)  # type: ignore[arg-type]


@task
def flow_step(acc: int, tag: str = "") -> int:
    """A workflow step: note it ran with ``acc`` (a parent's result) and return acc + 1."""
    _note("flow_step", acc=acc, tag=tag)
    return acc + 1


@task
def flow_member(i: int) -> int:
    """A group member: count its runs (one hash field per member) and return 2 * i."""
    _client().hincrby("test:members", str(i), 1)
    return 2 * i


@task
def flow_collect(results: list[int | None], tag: str) -> int:
    """A group callback: note what it received (the members' results, in order)."""
    _note("flow_collect", tag=tag, n=len(results),
          total=sum(r for r in results if isinstance(r, int)), head=results[:3],
          nones=results.count(None))
    return len(results)


@task(max_attempts=3)
def returns_mib(mib: float) -> str:
    """A result of ``mib`` MiB of JSON (retried were it to fail by its own fault)."""
    return "x" * int(mib * 1024 * 1024)


@task(max_attempts=1)
def forks(how: str) -> int:
    """Fork; the child comes back to the worker (returns, or raises SystemExit) instead
    of ending itself. The parent waits for it and returns its exit code."""
    with warnings.catch_warnings():  # fork() in a process with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        if how == "exit":
            sys.exit(3)
        return -1
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@task(max_attempts=1)
async def forks_async() -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        return -1
    _, status = await asyncio.to_thread(os.waitpid, pid, 0)
    return os.waitstatus_to_exitcode(status)

