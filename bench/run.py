"""Benchmark orchestrator: django-delayq against RQ, Celery, Dramatiq, Huey, arq and SAQ.

Runs under the project's virtualenv. It starts a throwaway Redis on a free loopback port,
then, for each run, measures the ceiling, every library's single enqueues back to back,
then each library's other workloads (libraries in an order that rotates each run). Each
workload is one call of ``python -m bench.harness <adapter> <op>`` as a subprocess with
the library's own interpreter, with a FLUSHALL before each. Each figure is the median
over ``--runs`` runs. Then django-delayq's own rows: time limits on against off, the
library's default configuration with its mirror against without, and ``MIN_REPLICAS``
on a primary with a replica. Writes ``latest.json``, ``latest.md`` and ``latest.png``.

    python -m bench.run [--scale 1] [--runs 3] [--libraries django_delayq,rq,...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import redis

from bench import configurations, record, replicas, report
from bench.harness.cpu import redis_cpu_s
from bench.harness.processes import worker_env

BENCH_DIR = record.BENCH_DIR
ROOT = record.ROOT

LIBRARIES = ["django_delayq", "rq", "celery", "dramatiq", "huey", "arq", "saq"]
PEERS = [lib for lib in LIBRARIES if lib != "django_delayq"]
ADAPTER_MODULES = {lib: f"{lib.removeprefix('django_')}_bench" for lib in LIBRARIES}

# Workload sizes at --scale 1, chosen so a full run takes about 30 minutes on 2 cores.
BASE_SIZES = {
    "enqueue_n": 5_000,
    "bulk_n": 10_000,
    "process_n": 20_000,
    "lateness_n": 2_000,
    "memory_n": 100_000,
    "growth_small_n": 1_000,
    "growth_large_n": 200_000,
    "growth_measure_n": 2_000,
    "ceiling_n": 20_000,
}
LATENESS_WINDOW_S = (2.0, 6.0)
MIN_PROCESS_N = 2_000
TWO_PROCESS_SECONDS = 2.0  # the 2-process backlog is at least this much 1-process work
MAX_PROCESS_N = 200_000


def sizes_for(scale: float) -> dict[str, int]:
    sizes = {k: max(1, round(v * scale)) for k, v in BASE_SIZES.items()}
    sizes["growth_measure_n"] = max(2, sizes["growth_measure_n"])
    sizes["lateness_n"] = max(2, sizes["lateness_n"])
    # Jobs are counted in reports of up to 2 ms of work: a smaller backlog may drain in
    # too few reports to time its window.
    sizes["process_n"] = max(MIN_PROCESS_N, sizes["process_n"])
    sizes["two_process_min_ms"] = round(1000 * TWO_PROCESS_SECONDS * scale)
    sizes["memory_n"] = max(
        sizes["memory_n"], sizes["growth_small_n"] + 2 * sizes["growth_measure_n"]
    )
    sizes["growth_large_n"] = max(sizes["growth_large_n"], sizes["memory_n"] + 1)
    return sizes


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Runner:
    """Calls adapters (``python -m bench.harness``): argv in, one JSON line out."""

    def __init__(self, url: str, interpreters: dict[str, str]) -> None:
        self.url = url
        self.interpreters = interpreters
        self.client = redis.Redis.from_url(url)

    def call(self, lib: str, op: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.client.flushall()
        env = worker_env({"BENCH_REDIS_URL": self.url})
        env.pop("DJANGO_SETTINGS_MODULE", None)
        argv = [self.interpreters[lib], "-m", "bench.harness", ADAPTER_MODULES[lib], op,
                json.dumps({"url": self.url, **params})]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                                  cwd=str(ROOT), env=env, check=False)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"{op} took longer than {timeout:.0f}s"}
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            tail = proc.stderr.strip().splitlines()[-5:]
            return {
                "ok": False,
                "error": f"{op}: no result (exit {proc.returncode}): " + " | ".join(tail),
            }
        out: dict[str, Any] = json.loads(lines[-1])
        if not out.get("ok"):
            log(f"{lib} {op} failed: {out.get('error')}")
        return out


def two_process_backlog(sizes: dict[str, int], one_process: dict[str, Any]) -> int:
    """The backlog of the 2-process run: process_n jobs, or more if one process drained
    them at a rate that makes that less than ``two_process_min_ms`` of work. Two
    processes start up to ~0.5 s apart: a backlog that drains faster is mostly eaten by
    the first one alone, and the window in which both run (see
    ``bench.harness.ops.op_process``) is a fraction of a second of two processes still
    starting up."""
    rate = one_process.get("per_s") if one_process.get("ok") else None
    if not rate:
        return sizes["process_n"]
    wanted = round(rate * sizes["two_process_min_ms"] / 1000)
    return min(MAX_PROCESS_N, max(sizes["process_n"], wanted))


def run_order(libraries: list[str], run: int) -> list[str]:
    """The libraries in the order run ``run`` (0-based) measures them: rotated by one each
    run, so no library is always first (the machine may speed up or slow down)."""
    shift = run % len(libraries) if libraries else 0
    return libraries[shift:] + libraries[:shift]


def measure_enqueues(runner: Runner, libraries: list[str], sizes: dict[str, int]
                     ) -> dict[str, dict[str, Any]]:
    """The single-enqueue workload of every library, back to back. Single enqueues are
    round-trip bound, and round trips drift over minutes: measured in one stretch, a
    library's rate is compared with its peers' as the machine was for all of them."""
    raw = {}
    for lib in libraries:
        t0 = time.monotonic()
        raw[lib] = runner.call(lib, "enqueue", {"n": sizes["enqueue_n"]}, 600)
        log(f"{lib} enqueue: {_brief(raw[lib])} ({time.monotonic() - t0:.1f}s)")
    return raw


def measure_library(runner: Runner, lib: str, sizes: dict[str, int], run: int = 0
                    ) -> dict[str, Any]:
    """One run of every workload for one library but single enqueues (see
    ``measure_enqueues``): the raw figures of that run. For django-delayq, its process
    pool (``runworker --processes 2``) drains the 2-process backlog too, right before or
    after the two separate processes (the order alternates with ``run``)."""
    start, end = LATENESS_WINDOW_S
    Call = tuple[str, str, dict[str, Any], float]
    two: list[Call] = [("process_2", "process", {"procs": 2, "timeout": 300}, 420)]  # n: process_1
    if lib == "django_delayq":
        pool: Call = ("process_pool", "process", {"procs": 2, "variant": "pool", "timeout": 300},
                      420)
        two = [*two, pool] if run % 2 == 0 else [pool, *two]
    calls: list[Call] = [
        ("bulk", "bulk", {"n": sizes["bulk_n"]}, 600),
        ("process_1", "process", {"n": sizes["process_n"], "procs": 1, "timeout": 300}, 420),
        *two,
        (
            "lateness",
            "lateness",
            {"n": sizes["lateness_n"], "start_s": start, "end_s": end, "timeout": 60},
            300,
        ),
        (
            "storage",
            "storage",
            {
                "memory_n": sizes["memory_n"],
                "small_n": sizes["growth_small_n"],
                "large_n": sizes["growth_large_n"],
                "measure_n": sizes["growth_measure_n"],
            },
            1200,
        ),
    ]
    raw: dict[str, Any] = {}
    for key, op, params, timeout in calls:
        t0 = time.monotonic()
        if key in ("process_2", "process_pool"):
            params = {**params, "n": two_process_backlog(sizes, raw["process_1"])}
        raw[key] = runner.call(lib, op, params, timeout)
        log(f"{lib} {key}: {_brief(raw[key])} ({time.monotonic() - t0:.1f}s)")
    return raw


def _brief(out: dict[str, Any]) -> str:
    if not out.get("ok"):
        return f"ERROR {out.get('error')}"
    for k in ("per_s", "lateness_ms", "redis_bytes_per_delayed_job"):
        if k in out:
            v = out[k]
            return f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}"
    return "ok"


def _median(values: list[Any]) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return float(statistics.median(vals)) if vals else None


def summarize(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The median over runs of each figure, and the errors seen."""
    failures = Counter(
        f"{k}: {v.get('error')}" for r in runs for k, v in r.items() if not v.get("ok")
    )
    # The figure of a workload that failed in some runs is the median of the others.
    errors = sorted(f"{e} ({n} of {len(runs)} runs)" for e, n in failures.items())

    def pick(key: str, field: str) -> list[Any]:
        return [r[key].get(field) for r in runs if r[key].get("ok")]

    def late(p: str) -> float | None:
        return _median([r["lateness"]["lateness_ms"][p] for r in runs if r["lateness"].get("ok")])

    result = {
        "enqueue_per_s": _median(pick("enqueue", "per_s")),
        # enqueue rate / redis-py single ZADD rate, timed in alternating blocks of 100
        "enqueue_vs_zadd": _median(pick("enqueue", "vs_zadd")),
        "bulk_enqueue_per_s": _median(pick("bulk", "per_s")),
        "process_per_s_1proc": _median(pick("process_1", "per_s")),
        "process_per_s_2proc": _median(pick("process_2", "per_s")),
        "lateness_ms": {p: late(p) for p in ("p50", "p95", "p99", "max")},
        "early": _median(pick("lateness", "early")),
        "redis_bytes_per_delayed_job": _median(pick("storage", "redis_bytes_per_delayed_job")),
        "enqueue_growth_ratio": _median(pick("storage", "enqueue_growth_ratio")),
        "enqueue_growth_ratio_vs_zadd": _median(pick("storage", "enqueue_growth_ratio_vs_zadd")),
    }
    if result["early"] is not None:
        result["early"] = round(result["early"])
    result.update(cpu_figures(runs, result, os.cpu_count() or 1))
    return result, errors


def cpu_figures(runs: list[dict[str, Any]], result: dict[str, Any], cores: int) -> dict[str, Any]:
    """Where the CPU goes (medians over runs, microseconds): per enqueue call in the
    client process and in Redis; per processed job in the worker processes and in
    Redis; how many cores a processing run kept busy (rate x CPU per job); and the most
    two processes could reach, as a multiple of one, with every core busy at the CPU
    per job of the 2-process run (``cores / (CPU per job x 1-process rate)``)."""

    def cpu(key: str, part: str) -> float | None:
        return _median([(r[key].get("cpu_us") or {}).get(part) for r in runs if r[key].get("ok")])

    out: dict[str, Any] = {
        "enqueue_cpu_us": {"client": cpu("enqueue", "client"), "redis": cpu("enqueue", "redis")}
    }
    both: dict[str, float | None] = {}  # workers + Redis CPU per job, by run
    for procs, run in (("1proc", "process_1"), ("2proc", "process_2")):
        per_job = {"workers": cpu(run, "workers"), "redis": cpu(run, "redis")}
        out[f"process_cpu_us_per_job_{procs}"] = per_job
        both[procs] = None if None in per_job.values() else sum(per_job.values())
        rate = result[f"process_per_s_{procs}"]
        out[f"cores_busy_{procs}"] = (
            None if rate is None or both[procs] is None else rate * both[procs] / 1e6
        )
    one, per_job_2 = result["process_per_s_1proc"], both["2proc"]
    out["process_2proc_cpu_bound_x"] = (
        None if one is None or per_job_2 is None else cores * 1e6 / per_job_2 / one
    )
    return out


def measure_ceiling(url: str, n: int) -> tuple[float, float]:
    """redis-py ZADD one call at a time, and pipelined in 1,000s: one run of each."""
    r = redis.Redis.from_url(url)
    r.flushall()
    t0 = time.perf_counter()
    for i in range(n):
        r.zadd("bench:ceiling", {f"job-{i}": i})
    single = n / (time.perf_counter() - t0)
    r.flushall()
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(n, start + 1000)):
            pipe.zadd("bench:ceiling", {f"job-{i}": i})
        pipe.execute()
    piped = n / (time.perf_counter() - t0)
    r.flushall()
    return single, piped


def measure_call_floor(url: str, n: int) -> dict[str, float]:
    """Redis CPU (µs, ``INFO cpu``) per call of the cheapest one-round-trip enqueues, one
    call at a time: an ``LPUSH`` of a 100-byte message, and an ``EVALSHA`` of
    ``return 1`` given the 7 keys and 11 arguments of django-delayq's enqueue script
    for one job (``lua/enqueue.lua``).
    What a library's enqueue costs Redis beyond these is the work it does there."""
    r = redis.Redis.from_url(url)
    sha = r.script_load("return 1")
    message = "x" * 100
    calls = {
        "lpush": ("LPUSH", "bench:floor", message),
        "evalsha_return_1": ("EVALSHA", sha, 7, *(f"{{dq:bench}}:{k}" for k in "srmeqjt"),
                             "10000", "0", "0123456789abcdef", "bench.noop", "[]", "{}", "0",
                             "", "", "1", ""),
    }
    out = {}
    for name, call in calls.items():
        r.execute_command(*call)  # the connection is open before the count starts
        before = redis_cpu_s(r)
        for _ in range(n):
            r.execute_command(*call)
        out[name] = (redis_cpu_s(r) - before) / n * 1e6
    r.flushall()
    return out


def start_own_redis() -> Any:
    """A throwaway redis-server (``--save "" --appendonly no``, loopback, free port).

    Checks that the server answering is the one started: a port picked as free can be
    taken by another process's throwaway Redis before ours binds it, and that server
    may vanish mid-run.
    """
    from django_delayq.testing import RedisServer

    for _ in range(5):
        server = RedisServer().start()
        try:
            pid = int(redis.Redis.from_url(server.url).info("server")["process_id"])
        except redis.RedisError:
            pid = -1
        if server.process is not None and pid == server.process.pid:
            return server
        server.cleanup()
    raise RuntimeError("could not start a redis-server of our own on a free port")


def interpreters(peers_python: str) -> dict[str, str]:
    return {lib: (sys.executable if lib == "django_delayq" else peers_python) for lib in LIBRARIES}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = record.parser(__doc__)
    parser.add_argument("--runs", type=int, default=int(os.environ.get("BENCH_RUNS") or 3),
                        help="runs per figure (median; default $BENCH_RUNS or 3)")
    parser.add_argument(
        "--libraries",
        default=",".join(LIBRARIES),
        help="comma-separated subset of " + ",".join(LIBRARIES),
    )
    parser.add_argument(
        "--peers-python",
        default=str(BENCH_DIR / ".venv-peers/bin/python"),
        help="interpreter of the peers' virtualenv",
    )
    parser.add_argument(
        "--redis-url",
        default=None,
        help="use this (throwaway!) Redis instead of starting one; it is FLUSHALLed",
    )
    parser.add_argument("--time-limit-pairs", type=int, default=3,
                        help="pairs of 1-process runs with and without --timeout (default 3)")
    parser.add_argument("--default-runs", type=int, default=5,
                        help="runs of the default configuration, with its mirror and "
                             "without (default 5 each)")
    parser.add_argument("--no-chart", action="store_true", help="skip latest.png")
    args = parser.parse_args(argv)
    args.libraries = [s.strip() for s in args.libraries.split(",") if s.strip()]
    unknown = set(args.libraries) - set(LIBRARIES)
    if unknown:
        parser.error(f"unknown libraries: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = sizes_for(args.scale)
    interp = interpreters(args.peers_python)
    missing = [lib for lib in args.libraries if lib in PEERS and not Path(interp[lib]).exists()]
    if missing:
        log(f"no peers virtualenv at {args.peers_python}: run bench/run.sh to create it")
        return 2

    server = None
    url = args.redis_url
    if url is None:
        server = start_own_redis()
        url = server.url
    this_run = record.Run("latest", args.scale)
    own = "django_delayq" in args.libraries
    try:
        runner = Runner(url, interp)
        info = {lib: runner.call(lib, "info", {}, 120) for lib in args.libraries}
        raw: dict[str, list[dict[str, Any]]] = {lib: [] for lib in args.libraries}
        ceilings, floors = [], []
        for run in range(args.runs):
            # The ceiling is measured in every run, so it sees the same machine load as
            # the libraries it is compared with.
            ceilings.append(measure_ceiling(url, sizes["ceiling_n"]))
            floors.append(measure_call_floor(url, sizes["ceiling_n"]))
            log(
                f"run {run + 1}/{args.runs}: ceiling {ceilings[-1][0]:,.0f}/s single, "
                f"{ceilings[-1][1]:,.0f}/s pipelined"
            )
            order = run_order(args.libraries, run)
            enqueues = measure_enqueues(runner, order, sizes)
            for lib in order:
                log(f"run {run + 1}/{args.runs}: {lib}")
                raw[lib].append({"enqueue": enqueues[lib],
                                 **measure_library(runner, lib, sizes, run)})
        ceiling = {
            "zadd_single_per_s": statistics.median(c[0] for c in ceilings),
            "zadd_pipelined_per_s": statistics.median(c[1] for c in ceilings),
            "redis_cpu_us_per_call": {
                name: statistics.median(f[name] for f in floors) for name in floors[0]
            },
            "n": sizes["ceiling_n"],
        }
        redis_info = runner.client.info("server")
        configs = None
        if own:
            configs = configurations.measure(
                lambda params: runner.call("django_delayq", "process", params, 900),
                args.scale, args.time_limit_pairs, args.default_runs, log)
            configs["pool"] = configurations.pool(raw["django_delayq"])
        # MIN_REPLICAS=1 against 0 on a primary with a replica of its own (bench/replicas.py).
        replication = replicas.measure(args.scale) if own else None
    finally:
        if server is not None:
            server.cleanup()

    results, notes, errors = {}, {}, {}
    for lib in args.libraries:
        results[lib], errs = summarize(raw[lib])
        notes[lib] = info[lib].get("notes", {})
        if errs:
            errors[lib] = errs
    environment = {
        **this_run.environment(),
        "peers_python": next(
            (i.get("python") for lib, i in info.items() if lib in PEERS and i.get("ok")), None
        ),
        "redis_version": redis_info.get("redis_version"),
        "library_versions": {lib: i.get("versions") for lib, i in info.items()},
        "runs": args.runs,
        "sizes": sizes,
        "lateness_window_s": list(LATENESS_WINDOW_S),
        "notes": notes,
        "errors": errors,
    }
    data = {"environment": environment, "results": results, "ceiling": ceiling,
            "configurations": configs, "replication": replication}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.json").write_text(json.dumps(data, indent=2) + "\n")
    (out / "latest.md").write_text(report.markdown(data, report.load_others(out)))
    if not args.no_chart:
        report.chart_anywhere(out / "latest.json", out / "latest.png", args.peers_python)
    log(f"wrote {out / 'latest.json'} in {environment['duration_s']}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
