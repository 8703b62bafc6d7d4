"""django-delayq's own processing rows: one configuration of ``runworker`` against another,
on the same backlog and with the same window as the peers' table (``op_process``).

- **pool**: one ``runworker --processes 2`` (a supervisor and two children) against two
  separate ``runworker`` processes (the 2-process column), measured back to back in
  each run of the table (``bench.run.measure_library``);
- **time limits**: the 1-process rate with ``--timeout 60`` against without, in
  alternating pairs (off-on, on-off, ...) so that drift weighs on both alike;
- **async tasks**: the 1-process rate of the no-op job written as an ``async def`` task
  (run on the worker's event loop) against the sync one on threads, in alternating pairs;
- **supervision**: the 1-process rate of a worker process started alone (no host, no
  deadline board: nothing watches it) against the tuned ``runworker`` (a host and its
  supervised worker process), in alternating pairs: what supervision costs;
- **defaults**: one ``runworker`` as a user starts it with nothing set (the library's
  threads, its model mirror as ``runworker`` runs it by default, a fresh SQLite database,
  its log line per job) against the same with ``--no-mirror``, alternating, five runs
  each: the median, the spread, and how long after the last job the mirror had every
  event in the database.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.record import load, scaled

TIME_LIMIT_N = 100_000
ASYNC_N = 50_000
DEFAULTS_N = 100_000
Call = Callable[[dict[str, Any]], dict[str, Any]]


def spread(values: list[float]) -> float | None:
    """The largest distance of a run from the median, as a fraction of the median."""
    if not values:
        return None
    mid = statistics.median(values)
    return max(abs(v - mid) for v in values) / mid if mid else None


def _series(outs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, range and spread of the rates of identical runs (the failed ones left out),
    with each run's CPU per job of the workers and of Redis (None if too short to tell)."""
    done = [o for o in outs if o.get("ok")]
    rates = [o["per_s"] for o in done]

    def cpu(part: str) -> list[float | None]:
        return [(o.get("cpu_us") or {}).get(part) for o in done]

    workers = [v for v in cpu("workers") if v is not None]
    return {"per_s": rates, "median": statistics.median(rates) if rates else None,
            "min": min(rates, default=None), "max": max(rates, default=None),
            "spread": spread(rates), "errors": [o["error"] for o in outs if not o.get("ok")],
            "cpu_us_per_job": {"workers": cpu("workers"), "redis": cpu("redis"),
                               "workers_median": statistics.median(workers) if workers
                               else None}}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def alternating(pairs: int) -> list[bool]:
    """The order of ``pairs`` A/B pairs as A?: A B, B A, A B, ..."""
    order = []
    for i in range(pairs):
        order += [True, False] if i % 2 == 0 else [False, True]
    return order


def paired(call: Call, n: int, pairs: int, variant: str, label: str,
           log: Callable[[str], None]) -> dict[str, Any]:
    """The 1-process rate of the workers of ``variant`` against the tuned worker's, in
    alternating pairs (off-on, on-off, ...) so that drift weighs on both alike."""
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for on in alternating(pairs):
        params = {"n": n, "procs": 1, "timeout": 300, **({"variant": variant} if on else {})}
        runs[on].append(out := call(params))
        log(f"{label} {'on' if on else 'off'}: {_brief(out)}")
    with_it, without = _series(runs[True]), _series(runs[False])
    return {"n": n, "pairs": pairs, "on": with_it, "off": without,
            "ratio": _ratio(with_it["median"], without["median"])}


def defaults(call: Call, n: int, runs: int, log: Callable[[str], None]) -> dict[str, Any]:
    """The default configuration with its mirror against ``--no-mirror``."""
    outs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for mirror in alternating(runs):
        variant = "defaults" if mirror else "defaults_no_mirror"
        outs[mirror].append(out := call({"n": n, "procs": 1, "variant": variant,
                                         "settle": mirror, "timeout": 600}))
        log(f"defaults, mirror {'on' if mirror else 'off'}: {_brief(out)}")
    with_mirror, without = _series(outs[True]), _series(outs[False])
    settled = [o["settled_after_last_s"] for o in outs[True]
               if o.get("ok") and o.get("settled_after_last_s") is not None]
    with_mirror["settled_after_last_s"] = settled
    with_mirror["settled_after_last_s_median"] = statistics.median(settled) if settled else None
    # From the first job run to the last one's row in the database: the whole drain.
    drains = [n / (o["first_to_last_s"] + o["settled_after_last_s"]) for o in outs[True]
              if o.get("ok") and o.get("settled_after_last_s") is not None]
    with_mirror["drained_to_database_per_s"] = statistics.median(drains) if drains else None
    return {"n": n, "runs": runs, "mirror": with_mirror, "no_mirror": without,
            "mirror_vs_no_mirror": _ratio(with_mirror["median"], without["median"])}


def pool(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The pool against two separate processes, from the runs of the peers' table."""
    pairs = [(r["process_2"], r["process_pool"]) for r in runs if "process_pool" in r]
    if not pairs:
        return None
    separate = _series([s for s, _ in pairs])
    pooled = _series([p for _, p in pairs])

    def cpu(outs: list[dict[str, Any]], part: str) -> float | None:
        values = [o["cpu_us"][part] for o in outs if o.get("ok") and o.get("cpu_us")]
        return statistics.median(values) if values else None

    backlog = next((o.get("done") for o, _ in pairs if o.get("ok")), None)
    return {"n": backlog, "separate": separate, "pool": pooled,
            "pool_vs_separate": _ratio(pooled["median"], separate["median"])}


def _brief(out: dict[str, Any]) -> str:
    if not out.get("ok"):
        return f"ERROR {out.get('error')}"
    extra = out.get("settled_after_last_s")
    return f"per_s={out['per_s']:,.0f}" + (f" mirror +{extra:.2f}s" if extra is not None
                                            else "")


def measure(call: Call, scale: float, pairs: int, default_runs: int,
            log: Callable[[str], None]) -> dict[str, Any]:
    """The time-limit, async and defaults rows (the pool's come from the peers' table); a
    row asked for 0 runs is left out."""
    start, load_start = time.monotonic(), load()
    out: dict[str, Any] = {}
    if pairs:
        out["time_limits"] = paired(call, scaled(TIME_LIMIT_N, scale, 2_000), pairs,
                                    "timeout", "time limits", log)
        out["async_tasks"] = paired(call, scaled(ASYNC_N, scale, 2_000), pairs, "async",
                                    "async tasks", log)
        out["supervision"] = paired(call, scaled(TIME_LIMIT_N, scale, 2_000), pairs,
                                    "unsupervised", "unsupervised worker process", log)
    if default_runs:
        out["defaults"] = defaults(call, scaled(DEFAULTS_N, scale, 2_000), default_runs, log)
    out.update(load_average_start=load_start, load_average_end=load(),
               duration_s=round(time.monotonic() - start, 1))
    return out
