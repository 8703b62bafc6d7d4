"""The workloads, measured the same way for every library.

An adapter (``bench/adapters/<lib>_bench.py``) only says how its library enqueues a job
and how its worker is started (:class:`Adapter`); each operation here takes one, a
redis-py client and the operation's parameters, and returns its figures.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from .cpu import CpuSampler, own_cpu_s, redis_cpu_s
from .marks import (
    COUNT_KEY,
    FIRST_KEY,
    FIRSTS_KEY,
    LAST_KEY,
    LATE_KEY,
    WINDOW_HI_KEY,
    WINDOW_KEY,
    WINDOW_LO_KEY,
)
from .processes import stop_processes

# Far enough out that nothing is due while memory and enqueue growth are measured.
FAR_OUT_S = 3600.0
REF_KEY = "bench:ref"
REF_BLOCK = 100
CPU_PASS = 2000  # enqueue calls of the CPU pass
# Once a run's figures are in Redis, its workers have this long to exit before their
# process trees are killed: a warm stop (waiting for a blocking read to return, seconds
# for some libraries) would only add to every run's time.
DONE_GRACE_S = 0.5

Workers = list[subprocess.Popen[bytes]]


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
    start_workers: Callable[[int, bool], Workers]
    notes: dict[str, Any] = field(default_factory=dict)
    close: Callable[[], None] = lambda: None
    # Other ways to start the workers of a processing run (a process pool, a time limit,
    # the library's defaults), by name: each starts `procs` processes' worth of workers.
    variants: dict[str, Callable[[int], Workers]] = field(default_factory=dict)
    # The preload of a variant whose jobs are other than `preload_noop`'s, by name.
    variant_preloads: dict[str, Callable[[int], None]] = field(default_factory=dict)
    # Whether the work the library does after a job (a database mirror) has caught up.
    settled: Callable[[], bool] | None = None


def due_datetime(due_us: int) -> datetime:
    """An epoch in microseconds as the aware UTC datetime the scheduling APIs take."""
    return datetime.fromtimestamp(due_us / 1_000_000, tz=UTC)


def chunks(n: int, size: int = 1000) -> Iterable[int]:
    done = 0
    while done < n:
        step = min(size, n - done)
        yield step
        done += step


def redis_now_us(r: Any) -> int:
    s, us = r.time()
    return int(s) * 1_000_000 + int(us)


def _mark(value: bytes | str | None) -> tuple[int, float]:
    """A "count seconds.micros" mark of ``lua/done.lua`` as (count, Redis time)."""
    if value is None:
        raise RuntimeError("no job recorded a time")
    count, stamp = value.split()
    return int(count), float(stamp)


def _rate(n: int, seconds: float) -> float:
    return n / max(seconds, 1e-6)


def interleaved(calls: Sequence[Callable[[], None]], r: Any) -> tuple[float, float]:
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


def op_enqueue(a: Adapter, r: Any, p: dict[str, Any]) -> dict[str, Any]:
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


def op_bulk(a: Adapter, r: Any, p: dict[str, Any]) -> dict[str, Any]:
    if a.bulk_noop is None:
        return {"per_s": None}
    n = int(p["n"])
    a.bulk_noop(2)
    t0 = time.perf_counter()
    a.bulk_noop(n)
    return {"per_s": _rate(n, time.perf_counter() - t0)}


def _wait_for(check: Callable[[], bool], timeout: float, procs: Workers) -> None:
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


def op_process(a: Adapter, r: Any, p: dict[str, Any]) -> dict[str, Any]:
    """Processing rate of a preloaded backlog, over the steady part of the run.

    Worker processes become ready at different moments (a second one may start a few
    hundred ms after the first), so the window opens once every process has reported
    its first jobs (and not before the report that passes the lo-th job), and closes at
    the report that passes the hi-th (:func:`process_window`). Each mark holds the count
    reached with its time, so the rate is exact whatever a report carries.

    ``variant`` names one of the adapter's other ways to start its workers; with
    ``settle``, the run also waits for the library's follow-up work (its database
    mirror) and reports how long after the last job that caught up.
    """
    n, procs_n = int(p["n"]), int(p["procs"])
    lo, hi = process_window(n)
    r.delete(WINDOW_LO_KEY, WINDOW_HI_KEY, FIRSTS_KEY)
    r.set(WINDOW_KEY, f"{lo} {hi} {n}")
    variant = p.get("variant")
    a.variant_preloads.get(variant or "", a.preload_noop)(n)
    procs = a.variants[variant](procs_n) if variant else a.start_workers(procs_n, False)
    cpu = CpuSampler(r, procs)
    settled_s = None
    try:
        timeout = float(p.get("timeout", 300))
        _wait_for(lambda: cpu.sample() >= n, timeout, procs)
        if p.get("settle") and a.settled is not None:
            _wait_for(a.settled, timeout, procs)
            settled_s = redis_now_us(r) / 1e6 - _mark(r.get(LAST_KEY))[1]
    finally:
        stop_processes(procs, grace=DONE_GRACE_S)
    (first_n, first), (last_n, last) = _mark(r.get(FIRST_KEY)), _mark(r.get(LAST_KEY))
    end_n, end = _mark(r.get(WINDOW_HI_KEY))
    firsts = [_mark(v) for v in r.hgetall(FIRSTS_KEY).values()]
    start_n, start, seen = steady_start(_mark(r.get(WINDOW_LO_KEY)), end_n, firsts)
    if end_n <= start_n:
        raise RuntimeError(f"the measured window of {n} jobs fell in one report: use a "
                           "larger backlog")
    out = {"per_s": _rate(end_n - start_n, end - start), "seconds": end - start,
           "window_jobs": end_n - start_n, "pids_in_window": seen,
           "cpu_us": cpu.per_job_us(start_n, end_n),
           "done": int(r.get(COUNT_KEY) or 0),
           "first_to_last_per_s": _rate(last_n - first_n, last - first),
           "first_to_last_s": last - first}
    if p.get("settle"):
        out["settled_after_last_s"] = settled_s
    return out


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list: the value of rank ceil(q% of n)."""
    if not sorted_values:
        raise ValueError("no values")
    rank = math.ceil(q * len(sorted_values) / 100 - 1e-9)  # 95% of 2,000 is 1,900, not 1,901
    return float(sorted_values[max(1, min(len(sorted_values), rank)) - 1])


def op_lateness(a: Adapter, r: Any, p: dict[str, Any]) -> dict[str, Any]:
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
        stop_processes(procs, grace=DONE_GRACE_S)
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


def _far_dues(r: Any, n: int, offset: int) -> list[int]:
    # Spread over an hour, starting an hour out: inserts land all over the sorted set.
    base = redis_now_us(r) + int(FAR_OUT_S * 1_000_000)
    return [base + ((offset + i) * 7919 % 3_600_000) * 1000 for i in range(n)]


def op_storage(a: Adapter, r: Any, p: dict[str, Any]) -> dict[str, Any]:
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


def op_info(a: Adapter, r: Any, p: dict[str, Any]) -> dict[str, Any]:
    return {
        "versions": a.versions(),
        "python": sys.version.split()[0],
        "notes": a.notes,
    }


OPS: dict[str, Callable[[Adapter, Any, dict[str, Any]], dict[str, Any]]] = {
    "info": op_info,
    "enqueue": op_enqueue,
    "bulk": op_bulk,
    "process": op_process,
    "lateness": op_lateness,
    "storage": op_storage,
}
