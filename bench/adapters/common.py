"""Shared driver for the benchmark adapters.

Every adapter is a script run with its library's interpreter:

    python bench/adapters/<lib>_bench.py OP '{"url": ..., "n": ...}'

It prints exactly one JSON line on stdout (``{"ok": true, ...}`` or ``{"ok": false,
"error": ...}``) and nothing else; logs of peer workers go to stderr or to files.

The measurement code lives here, so every library is timed the same way. An adapter
only says how its library enqueues a job and how its worker is started:

* ``noop`` task: calls :func:`mark_done`, which only counts the job in the process.
  A thread of each worker process reports the count every few milliseconds (one
  EVALSHA over a plain socket: INCRBY the shared counter and stamp the Redis time and
  the count when it passes the start, the ends of the measured window or the total, and
  on each process's first report). A no-op job thus costs no Redis call of its own, and
  costs every library the same.
* ``late(due_us)`` task: calls :func:`mark_late` (one EVALSHA: Redis ``TIME`` minus the
  due time, pushed onto a list), so lateness is read on the Redis clock for everyone.

This module imports only the standard library and redis-py, which both virtualenvs have.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis

ADAPTERS_DIR = Path(__file__).resolve().parent
COUNT_KEY = "bench:count"
FIRST_KEY = "bench:first"
LAST_KEY = "bench:last"
WINDOW_KEY = "bench:window"  # "lo hi n": the job counts that open and close the window, all
WINDOW_LO_KEY = "bench:window:lo"
WINDOW_HI_KEY = "bench:window:hi"
FIRSTS_KEY = "bench:firsts"  # HASH pid -> "count stamp" of that process's first job
DONE_KEYS = [COUNT_KEY, FIRST_KEY, LAST_KEY, WINDOW_LO_KEY, WINDOW_HI_KEY, FIRSTS_KEY]
LATE_KEY = "bench:late"
# Connections the lateness task's client opens ahead: more than any worker's threads.
WARM_CONNECTIONS = 16
URL_ENV = "BENCH_REDIS_URL"

# KEYS: count, first, last, window lo, window hi, firsts. ARGV: the pid of the reporting
# process, 1 on its first report (else 0), the jobs it finished since its last report,
# the counts lo, hi and n. Adds the jobs to the count and, when the count passes 1, lo, hi
# or n or on a process's first report, stores "count seconds.micros" (the count reached
# and the Redis time; Lua's number formatting would round a microsecond epoch).
DONE_LUA = """
local d = tonumber(ARGV[3])
local c = redis.call('INCRBY', KEYS[1], d)
local b = c - d
local lo, hi, n = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local function passed(x) return b < x and x <= c end
local first_here = ARGV[2] == '1'
if passed(1) or passed(lo) or passed(hi) or passed(n) or first_here then
  local t = redis.call('TIME')
  local mark = c .. ' ' .. t[1] .. '.' .. string.format('%06d', tonumber(t[2]))
  if passed(1) then redis.call('SET', KEYS[2], mark) end
  if passed(n) then redis.call('SET', KEYS[3], mark) end
  if passed(lo) then redis.call('SET', KEYS[4], mark) end
  if passed(hi) then redis.call('SET', KEYS[5], mark) end
  if first_here then redis.call('HSETNX', KEYS[6], ARGV[1], mark) end
end
return c
"""

# KEYS: late list. ARGV: due seconds, due micros. Pushes start - due in microseconds.
LATE_LUA = """
local t = redis.call('TIME')
local d = (tonumber(t[1]) - tonumber(ARGV[1])) * 1000000 + (tonumber(t[2]) - tonumber(ARGV[2]))
redis.call('RPUSH', KEYS[1], d)
return d
"""

# Far enough out that nothing is due while memory and enqueue growth are measured.
FAR_OUT_S = 3600.0


def redis_url() -> str:
    return os.environ[URL_ENV]


# --- task bodies (run inside the peer workers) ----------------------------------------
#
# The no-op task only counts; the count reaches Redis from a reporter thread per
# process, over a plain socket with a command built here, not through redis-py (the two
# virtualenvs hold different redis-py versions, and the task must cost every library the
# same). The lateness task, not a throughput figure, calls Redis itself, via redis-py.

REPORT_EVERY_S = 0.002  # how long a report waits for more jobs once one is counted


def resp_command(*parts: Any) -> bytes:
    """One Redis command in the protocol's wire format."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        data = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def _address() -> tuple[str, int, int]:
    url = urlsplit(redis_url())
    return url.hostname or "127.0.0.1", url.port or 6379, int(url.path.strip("/") or 0)


def _reply_value(line: bytes, rest: Callable[[], bytes]) -> bytes:
    """The value of a simple, integer or bulk reply line (b"" for nil); errors raise."""
    if line[:1] == b"-" or not line.endswith(b"\r\n"):
        raise RuntimeError(f"redis: {line[1:].strip().decode(errors='replace') or 'closed'}")
    if line.startswith(b"$-1"):
        return b""
    if line[:1] == b"$":
        return rest()[:-2]
    return line[1:-2]


class DoneReporter:
    """Counts the no-op jobs of this process; a daemon thread adds them to the shared
    count in Redis at most every REPORT_EVERY_S while jobs finish."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pending = 0
        self.wake = threading.Event()
        threading.Thread(target=self._run, name="bench-done", daemon=True).start()

    def add(self) -> None:
        with self.lock:
            self.pending += 1
            if self.pending == 1:
                self.wake.set()

    def _run(self) -> None:
        host, port, db = _address()
        sock = socket.create_connection((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rfile = sock.makefile("rb")

        def call(*parts: Any) -> bytes:
            sock.sendall(resp_command(*parts))
            return _reply_value(rfile.readline(), rfile.readline)

        if db:
            call("SELECT", db)
        sha = call("SCRIPT", "LOAD", DONE_LUA).decode()
        lo, hi, n = [*call("GET", WINDOW_KEY).split(), b"0", b"0", b"0"][:3]
        first = 1
        while True:
            self.wake.wait()
            time.sleep(REPORT_EVERY_S)
            with self.lock:
                jobs, self.pending = self.pending, 0
                self.wake.clear()
            call("EVALSHA", sha, len(DONE_KEYS), *DONE_KEYS, os.getpid(), first, jobs, lo, hi, n)
            first = 0


_reporter: DoneReporter | None = None
_reporter_lock = threading.Lock()


def _forget_reporter() -> None:
    # A forked child has none of its parent's threads: it starts a reporter of its own.
    global _reporter, _reporter_lock
    _reporter, _reporter_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_reporter)


def mark_done() -> None:
    """The no-op task's body: count one finished job (no I/O).

    A process's first call also readies the lateness task's client (see ``_client``):
    every workload starts with a no-op job, outside the clock."""
    global _reporter
    reporter = _reporter
    if reporter is None:
        with _reporter_lock:
            if _reporter is None:
                _client()
                _reporter = DoneReporter()
            reporter = _reporter
    reporter.add()


_sync_client: redis.Redis | None = None
_sync_pid = 0
_sync_scripts: dict[str, Any] = {}


def _client() -> redis.Redis:
    """This process's client for the lateness task, ready before any clock starts: its
    script loaded and ``WARM_CONNECTIONS`` connections open. Opened on a worker thread's
    first due job instead, a connection (1-2 ms on a slow VM, several at once) would be
    counted as that job's lateness: the instrument's, not the queue's."""
    global _sync_client, _sync_pid
    if _sync_client is None or _sync_pid != os.getpid():
        client = redis.Redis.from_url(redis_url())
        _sync_scripts["late"] = client.register_script(LATE_LUA)
        client.script_load(LATE_LUA)
        pool, opened = client.connection_pool, []
        try:
            for _ in range(WARM_CONNECTIONS):
                try:
                    opened.append(pool.get_connection())
                except TypeError:  # redis-py 5 wants a command name
                    opened.append(pool.get_connection("PING"))
        finally:
            for conn in opened:
                pool.release(conn)
        _sync_client, _sync_pid = client, os.getpid()
    return _sync_client


def mark_late(due_us: int) -> None:
    _client()
    due_s, due_frac = divmod(int(due_us), 1_000_000)
    _sync_scripts["late"](keys=[LATE_KEY], args=[due_s, due_frac])


def due_datetime(due_us: int) -> datetime:
    """An epoch in microseconds as the aware UTC datetime the scheduling APIs take."""
    return datetime.fromtimestamp(due_us / 1_000_000, tz=UTC)


class AsyncMarks:
    """The same two task bodies for asyncio workers (arq, SAQ): the lateness task's
    call goes through redis.asyncio."""

    def __init__(self) -> None:
        import redis.asyncio as aredis

        self.client = aredis.Redis.from_url(redis_url())
        self.late_script = self.client.register_script(LATE_LUA)
        self.ready = False

    async def done(self) -> None:
        if not self.ready:  # as _client(): script loaded, connections open
            self.ready = True
            await self.client.script_load(LATE_LUA)
            await asyncio.gather(*(self.client.ping() for _ in range(WARM_CONNECTIONS)))
        mark_done()

    async def late(self, due_us: int) -> None:
        due_s, due_frac = divmod(int(due_us), 1_000_000)
        await self.late_script(keys=[LATE_KEY], args=[due_s, due_frac])


_async_marks: AsyncMarks | None = None


def async_marks() -> AsyncMarks:
    """The asyncio task bodies, created on first use inside the worker's event loop."""
    global _async_marks
    if _async_marks is None:
        _async_marks = AsyncMarks()
    return _async_marks


# --- worker processes ------------------------------------------------------------------


def start_process(argv: Sequence[str], name: str, extra_env: dict[str, str] | None = None):
    """Start a peer worker in its own process group, logging to bench/results/tmp."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ADAPTERS_DIR), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra_env:
        env.update(extra_env)
    log_dir = ADAPTERS_DIR.parent / "results" / "tmp"
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - closed in stop_processes
    proc = subprocess.Popen(
        list(argv),
        cwd=str(ADAPTERS_DIR),
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    proc._bench_log = log  # type: ignore[attr-defined]
    return proc


#: Keep in KEYS[1] the latest Redis time (µs) any caller noted (the workflow benchmark:
#: when the last member of a group ended, when its callback started).
MAX_TIME_LUA = """
local t = redis.call('TIME')
local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local old = tonumber(redis.call('GET', KEYS[1]) or '0')
if us > old then redis.call('SET', KEYS[1], us) end
return us
"""


def note_time(client: redis.Redis, key: str) -> None:
    """Raise ``key`` to the Redis time now (see ``MAX_TIME_LUA``)."""
    client.eval(MAX_TIME_LUA, 1, key)


def stop_processes(procs: Iterable[subprocess.Popen], grace: float = 10.0) -> None:
    """SIGTERM each worker's process group, then SIGKILL whatever is left after grace."""
    procs = list(procs)
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
    for p in procs:
        # Children of a prefork/process pool may outlive their parent: kill the group.
        _signal_group(p, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=5)
        log = getattr(p, "_bench_log", None)
        if log is not None:
            log.close()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)


# --- CPU accounting --------------------------------------------------------------------

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
GROUP_RESCAN = 1.0  # seconds between scans of /proc for the worker groups' processes
# /proc counts CPU in clock ticks (10 ms): a shorter span between samples gives no figure.
MIN_CPU_SPAN_S = 0.2


def own_cpu_s() -> float:
    """CPU seconds (user + system) this process has used."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def redis_cpu_s(r: redis.Redis) -> float:
    """CPU seconds (user + system) the Redis server has used (``INFO cpu``)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _stat(pid: str) -> tuple[int, float] | None:
    """(process group, CPU seconds) of ``pid`` from ``/proc``, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces): state ppid pgrp ... utime stime
    fields = text.rsplit(")", 1)[1].split()
    return int(fields[2]), (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class CpuSampler:
    """CPU used by the worker processes (every process of their process groups, threads
    and pool children included) and by Redis, sampled with the completion count while a
    backlog drains, so that the CPU per job can be read over the measured window."""

    def __init__(self, r: redis.Redis, procs: Sequence[subprocess.Popen]) -> None:
        self.r = r
        self.groups = {p.pid for p in procs}  # start_process gives each its own group
        self.members: list[str] = []
        self.scanned = -GROUP_RESCAN
        # (count, monotonic s, Redis CPU s, workers CPU s)
        self.samples: list[tuple[int, float, float, float]] = []

    def _workers_cpu(self) -> float:
        now = time.monotonic()
        if now - self.scanned >= GROUP_RESCAN:
            self.scanned = now
            self.members = [pid for pid in os.listdir("/proc") if pid.isdigit()
                            and (st := _stat(pid)) is not None and st[0] in self.groups]
        return sum(st[1] for pid in self.members if (st := _stat(pid)) is not None)

    def sample(self) -> int:
        """Record one sample; returns the completion count."""
        count = int(self.r.get(COUNT_KEY) or 0)
        self.samples.append((count, time.monotonic(), redis_cpu_s(self.r), self._workers_cpu()))
        return count

    def per_job_us(self, lo: int, hi: int) -> dict[str, float] | None:
        """Microseconds of CPU per job between the first and the last sample taken with
        the count in [lo, hi]; None when those samples are less than MIN_CPU_SPAN_S
        apart (or the count did not move), too short for CPU counted in clock ticks."""
        inside = [s for s in self.samples if lo <= s[0] <= hi]
        if len(inside) < 2 or inside[-1][0] == inside[0][0]:
            return None
        (c0, t0, r0, w0), (c1, t1, r1, w1) = inside[0], inside[-1]
        if t1 - t0 < MIN_CPU_SPAN_S:
            return None
        jobs = c1 - c0
        return {"workers": 1e6 * (w1 - w0) / jobs, "redis": 1e6 * (r1 - r0) / jobs,
                "jobs": jobs}


# --- measurements ----------------------------------------------------------------------


@dataclass
class Adapter:
    """What a library adapter provides. Callables are sync; async adapters wrap a loop."""

    name: str
    versions: Callable[[], dict[str, str]]
    enqueue_noop: Callable[[], None]
    # Enqueue n no-op jobs through the library's bulk API (None if it has none).
    bulk_noop: Callable[[int], None] | None
    # Fastest untimed way to put n no-op jobs in the queue (used to preload backlogs).
    preload_noop: Callable[[int], None]
    # Enqueue one `late(due_us)` job due at epoch microseconds `due_us`.
    enqueue_late: Callable[[int], None]
    # Fastest untimed way to enqueue late jobs due at each of `dues` (epoch micros).
    preload_late: Callable[[list[int]], None]
    # Start `procs` worker processes. `scheduler` asks for whatever runs delayed jobs.
    start_workers: Callable[[int, bool], list[subprocess.Popen]]
    notes: dict[str, Any] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None


def _mark(value: bytes | str | None) -> tuple[int, float]:
    """A "count seconds.micros" mark of DONE_LUA as (count, Redis time)."""
    if value is None:
        raise RuntimeError("no job recorded a time")
    count, stamp = value.split()
    return int(count), float(stamp)


def _rate(n: int, seconds: float) -> float:
    return n / max(seconds, 1e-6)


def chunks(n: int, size: int = 1000) -> Iterable[int]:
    done = 0
    while done < n:
        step = min(size, n - done)
        yield step
        done += step


def redis_now_us(r: redis.Redis) -> int:
    s, us = r.time()
    return int(s) * 1_000_000 + int(us)


REF_KEY = "bench:ref"
REF_BLOCK = 100
CPU_PASS = 2000  # enqueue calls of the CPU pass


def interleaved(calls: Sequence[Callable[[], None]], r: redis.Redis) -> tuple[float, float]:
    """Time ``calls`` in blocks of REF_BLOCK, each block followed by as many redis-py
    ``ZADD`` calls on ``r`` (the reference, the single-call ceiling): returns the rate of
    each. Round trips on a shared machine drift over seconds; measured block by block in
    one window, their ratio does not."""
    lib_s = ref_s = 0.0
    for start in range(0, len(calls), REF_BLOCK):
        block = calls[start:start + REF_BLOCK]
        t0 = time.perf_counter()
        for call in block:
            call()
        t1 = time.perf_counter()
        for i in range(start, start + len(block)):
            r.zadd(REF_KEY, {f"job-{i}": i})
        lib_s += t1 - t0
        ref_s += time.perf_counter() - t1
    r.delete(REF_KEY)
    return _rate(len(calls), lib_s), _rate(len(calls), ref_s)


def op_enqueue(a: Adapter, r: redis.Redis, p: dict[str, Any]) -> dict[str, Any]:
    n = int(p["n"])
    a.enqueue_noop()  # warm connections and script caches outside the clock
    r.zadd(REF_KEY, {"warm": 0})
    per_s, ref_per_s = interleaved([a.enqueue_noop] * n, r)
    # Where a call's time goes: CPU of this process and of Redis over more calls, untimed.
    m = min(n, CPU_PASS)
    redis0, own0 = redis_cpu_s(r), own_cpu_s()
    for _ in range(m):
        a.enqueue_noop()
    own1, redis1 = own_cpu_s(), redis_cpu_s(r)
    return {"per_s": per_s, "zadd_per_s": ref_per_s, "vs_zadd": per_s / ref_per_s,
            "cpu_us": {"client": 1e6 * (own1 - own0) / m, "redis": 1e6 * (redis1 - redis0) / m,
                       "calls": m}}


def op_bulk(a: Adapter, r: redis.Redis, p: dict[str, Any]) -> dict[str, Any]:
    if a.bulk_noop is None:
        return {"per_s": None}
    n = int(p["n"])
    a.bulk_noop(2)
    t0 = time.perf_counter()
    a.bulk_noop(n)
    return {"per_s": _rate(n, time.perf_counter() - t0)}


def _wait_for(check: Callable[[], bool], timeout: float, procs: list[subprocess.Popen]) -> None:
    """Poll ``check`` every 20 ms until it holds; raise if a worker exits or on timeout."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s")
        dead = [p for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"worker exited early with code {dead[0].returncode}")
        time.sleep(0.02)


def process_window(n: int) -> tuple[int, int]:
    """The jobs (by completion count) between which throughput is measured at most: the
    middle 80 %, so worker start-up and the last stragglers do not decide the figure."""
    if n < 3:
        raise ValueError("a process workload needs at least 3 jobs")
    lo = max(1, n // 10)
    return lo, max(lo + 1, n - n // 10)


def steady_start(lo: tuple[int, float], hi: int, firsts: Iterable[tuple[int, float]]
                 ) -> tuple[int, float, int]:
    """Where the measured window opens: at job ``lo`` or, if later, at the first report
    of the last worker process to start, so that every process is running throughout.

    ``lo`` and each of ``firsts`` are (completion count, Redis time). A process whose
    first report came at or after job ``hi`` took no part in the window and is ignored.
    Returns (count, time, processes that ran jobs in the window).
    """
    count, stamp = lo
    seen = 0
    for first_count, first_stamp in firsts:
        if first_count >= hi:
            continue
        seen += 1
        if first_stamp > stamp:
            count, stamp = first_count, first_stamp
    return count, stamp, seen


def op_process(a: Adapter, r: redis.Redis, p: dict[str, Any]) -> dict[str, Any]:
    """Processing rate of a preloaded backlog, over the steady part of the run.

    Worker processes become ready at different moments (a second one may start a few
    hundred ms after the first), so the window opens once every process has reported
    its first jobs (and not before the report that passes the lo-th job), and closes at
    the report that passes the hi-th (:func:`process_window`). Each mark holds the count
    reached with its time, so the rate is exact whatever a report carries.
    """
    n, procs_n = int(p["n"]), int(p["procs"])
    lo, hi = process_window(n)
    r.delete(WINDOW_LO_KEY, WINDOW_HI_KEY, FIRSTS_KEY)
    r.set(WINDOW_KEY, f"{lo} {hi} {n}")
    a.preload_noop(n)
    procs = a.start_workers(procs_n, False)
    cpu = CpuSampler(r, procs)
    try:
        _wait_for(lambda: cpu.sample() >= n, float(p.get("timeout", 300)), procs)
    finally:
        stop_processes(procs)
    (first_n, first), (last_n, last) = _mark(r.get(FIRST_KEY)), _mark(r.get(LAST_KEY))
    end_n, end = _mark(r.get(WINDOW_HI_KEY))
    firsts = [_mark(v) for v in r.hgetall(FIRSTS_KEY).values()]
    start_n, start, seen = steady_start(_mark(r.get(WINDOW_LO_KEY)), end_n, firsts)
    if end_n <= start_n:
        raise RuntimeError(f"the measured window of {n} jobs fell in one report: use a "
                           "larger backlog")
    return {"per_s": _rate(end_n - start_n, end - start), "seconds": end - start,
            "window_jobs": end_n - start_n, "pids_in_window": seen,
            "cpu_us": cpu.per_job_us(start_n, end_n),
            "done": int(r.get(COUNT_KEY) or 0),
            "first_to_last_per_s": _rate(last_n - first_n, last - first)}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        raise ValueError("no values")
    k = max(0, min(len(sorted_values) - 1, round(q / 100 * len(sorted_values) + 0.5) - 1))
    return float(sorted_values[k])


def op_lateness(a: Adapter, r: redis.Redis, p: dict[str, Any]) -> dict[str, Any]:
    n = int(p["n"])
    start_s, end_s = float(p.get("start_s", 2.0)), float(p.get("end_s", 6.0))
    procs = a.start_workers(1, True)
    try:
        # The worker must be consuming before the clock starts: one warm-up job.
        a.enqueue_noop()
        _wait_for(lambda: int(r.get(COUNT_KEY) or 0) >= 1, 120, procs)
        t0 = redis_now_us(r)
        span = (end_s - start_s) * 1_000_000
        dues = [int(t0 + start_s * 1_000_000 + span * i / max(n - 1, 1)) for i in range(n)]
        enqueue_t0 = time.perf_counter()
        for due in dues:
            a.enqueue_late(due)
        enqueue_s = time.perf_counter() - enqueue_t0
        _wait_for(lambda: r.llen(LATE_KEY) >= n, end_s + float(p.get("timeout", 60)), procs)
    finally:
        stop_processes(procs)
    values = sorted(int(float(v)) / 1000 for v in r.lrange(LATE_KEY, 0, -1))
    return {
        "lateness_ms": {
            "p50": percentile(values, 50),
            "p95": percentile(values, 95),
            "p99": percentile(values, 99),
            "max": values[-1],
        },
        "early": sum(1 for v in values if v < 0),
        "started": len(values),
        "enqueue_seconds": enqueue_s,
    }


def _far_dues(r: redis.Redis, n: int, offset: int) -> list[int]:
    # Spread over an hour, starting an hour out: inserts land all over the sorted set.
    base = redis_now_us(r) + int(FAR_OUT_S * 1_000_000)
    return [base + ((offset + i) * 7919 % 3_600_000) * 1000 for i in range(n)]


def op_storage(a: Adapter, r: redis.Redis, p: dict[str, Any]) -> dict[str, Any]:
    """Bytes per waiting delayed job, and single-enqueue cost small vs large backlog."""
    memory_n, small_n, large_n = int(p["memory_n"]), int(p["small_n"]), int(p["large_n"])
    measure_n = int(p["measure_n"])
    if not small_n + 2 * measure_n <= memory_n <= large_n:
        raise ValueError("need small_n + 2 * measure_n <= memory_n <= large_n")
    r.flushall()
    mem0 = int(r.info("memory")["used_memory"])
    waiting = 0

    def fill(target: int) -> None:
        nonlocal waiting
        if target > waiting:
            a.preload_late(_far_dues(r, target - waiting, waiting))
            waiting = target

    def timed_single() -> tuple[float, float]:
        nonlocal waiting
        dues = _far_dues(r, measure_n, waiting)
        rates = interleaved([functools.partial(a.enqueue_late, due) for due in dues], r)
        waiting += measure_n
        return rates

    fill(small_n)
    # Warm the single-enqueue path (connections, caches) so the first timed batch
    # does not carry start-up costs the second one does not.
    warm_n = min(200, measure_n)
    for due in _far_dues(r, warm_n, waiting):
        a.enqueue_late(due)
    waiting += warm_n
    rate_small, ref_small = timed_single()
    fill(memory_n)
    mem1 = int(r.info("memory")["used_memory"])
    fill(large_n - measure_n)
    rate_large, ref_large = timed_single()
    return {
        "redis_bytes_per_delayed_job": (mem1 - mem0) / memory_n,
        "enqueue_per_s_small": rate_small,
        "enqueue_per_s_large": rate_large,
        "enqueue_growth_ratio": rate_large / rate_small,
        # The same ratio with each rate taken relative to the ZADD blocks interleaved
        # with it: machine drift between the two measurements cancels out.
        "enqueue_growth_ratio_vs_zadd": (rate_large / ref_large) / (rate_small / ref_small),
    }


def op_info(a: Adapter, r: redis.Redis, p: dict[str, Any]) -> dict[str, Any]:
    return {
        "versions": a.versions(),
        "python": sys.version.split()[0],
        "notes": a.notes,
    }


OPS: dict[str, Callable[[Adapter, redis.Redis, dict[str, Any]], dict[str, Any]]] = {
    "info": op_info,
    "enqueue": op_enqueue,
    "bulk": op_bulk,
    "process": op_process,
    "lateness": op_lateness,
    "storage": op_storage,
}


def main(make_adapter: Callable[[], Adapter]) -> None:
    """Entry point of every adapter script: argv in, one JSON line out."""
    op = sys.argv[1]
    params: dict[str, Any] = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    if "url" in params:
        os.environ[URL_ENV] = params["url"]
    out: dict[str, Any]
    adapter: Adapter | None = None
    try:
        adapter = make_adapter()
        r = redis.Redis.from_url(redis_url())
        out = {"ok": True, **OPS[op](adapter, r, params)}
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        if adapter is not None:
            try:
                adapter.close()
            except Exception:
                traceback.print_exc(file=sys.stderr)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))
