"""A sharded queue's scaling on a local 3-primary Redis Cluster: 1, 2 and 3 shards.

    python -m bench.shards [--scale 1] [--jobs 60000] [--workers 2] [--prefetch auto,16]
                           [--repeat 1] [--baseline DIR]

For each shard count, the same backlog of no-op jobs (``tests.testapp.tasks.add``) is
enqueued into one queue (named so that its shards sit on different primaries) with
``SHARDS`` set to that count, then drained by the same
worker processes (``runworker --concurrency 8 --no-mirror``, the shards' keys spread
over the cluster's slots). Jobs per second are timed from the 10th to the 90th percent
of the backlog finished (start-up and tail left out); over that window the cluster's
Redis CPU (``INFO cpu`` of every primary) and the workers' CPU (``/proc``) are divided
by the jobs finished in it, and so are the script calls (``INFO commandstats``).

Each ``--prefetch`` gives a set of rows: ``auto`` is the adaptive prefetch (no-op jobs
are claimed by the hundred), ``16`` claims about 12 to 24 at a time, the batches of
8 threads running jobs of about 25 ms, with no-op jobs so that the run stays short.
``--repeat N`` measures each row N times, interleaved, and keeps the medians. Each row
also gives what its costs allow on more cores: jobs per second per core busy (Redis and
workers together) and the bound of the busiest primary (one core per Redis process).
``--baseline DIR`` runs each row also with the workers of another checkout of the
project (its ``django_delayq`` package), right before this one's, to compare two
versions on the same cluster under the same load. ``--one-server`` puts the shards on
one Redis server instead (one process: what the shards cost apart from being spread
over several) and writes ``shards_one_server.json``. Writes ``shards.json`` (in ``--out``)
with the load averages.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bench import record
from bench.harness.processes import process_tree, start_process, stop_processes
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.engine.urls import client_from_url
from django_delayq.testing import RedisServer
from tests.servers import RedisCluster

ROOT = record.ROOT
TASK = "tests.testapp.tasks.add"
JOBS = 60_000


def redis_cpu(nodes: list[Any]) -> list[float]:
    out = []
    for node in nodes:
        info = node.info("cpu")
        out.append(float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))
    return out


def proc_cpu(pids: list[int]) -> float:
    """CPU seconds of the processes ``pids`` and their worker processes."""
    return sum(st.cpu_s for st in process_tree(pids).values())


def script_calls(nodes: list[Any]) -> int:
    """Script calls (EVALSHA) every primary has run so far."""
    stats = (node.info("commandstats").get("cmdstat_evalsha") for node in nodes)
    return sum(int(s["calls"]) for s in stats if s)


def spread_queue(client: Any) -> str:
    """A queue name whose 3 shards (and so also its first 2) sit on 3 different
    primaries: a shard's node follows from its name's hash slot."""
    for n in range(1000):
        name = f"bench{n}"
        nodes = [client.get_node_from_key(k.ready).port for k in
                 Broker(client, EngineConfig(queues={name: {"shards": 3}})).shards(name)]
        if len(set(nodes)) == 3:
            return name
    raise RuntimeError("no queue name spreads its shards over the 3 primaries")


def finished(client: Any, broker: Broker, queue: str) -> int:
    return sum(int(client.hget(k.stats, "c") or 0) for k in broker.shards(queue))


def run(cluster: RedisCluster | RedisServer, shards: int, jobs: int, workers: int,
        prefetch: int | None, source: Path | None = None) -> dict[str, Any]:
    """Drain ``jobs`` from ``shards`` shards; the workers run ``source``'s package (a
    checkout of the project) if given, else this one's."""
    import redis

    client = client_from_url(cluster.url, decode_responses=True)
    ports = cluster.ports if isinstance(cluster, RedisCluster) else [cluster.port]
    queue = spread_queue(client) if isinstance(cluster, RedisCluster) else "bench"
    nodes = [redis.Redis(port=port) for port in ports]
    for node in nodes:
        node.flushall()
    broker = Broker(client, EngineConfig(queues={queue: {"shards": shards}}))
    broker.enqueue_many(queue, (EnqueueRequest(task=TASK, args=[i, 1]) for i in range(jobs)))
    client.sadd(broker.global_keys.queues, queue)
    placement = ([client.get_node_from_key(k.ready).port for k in broker.shards(queue)]
                 if isinstance(cluster, RedisCluster) else ports * shards)
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "DELAYQ_TEST_REDIS_URL": cluster.url,
           "DELAYQ_TEST_SETTINGS": json.dumps({"QUEUES": {queue: {"shards": shards}}})}
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(source), str(ROOT)])
    command = [sys.executable, "-m", "django", "runworker", queue, "--concurrency", "8",
               "--no-mirror", "-v", "0"]
    if prefetch is not None:
        command += ["--prefetch", str(prefetch)]
    procs = [start_process(command, f"shards-{shards}-{i}", env) for i in range(workers)]
    lo, hi = jobs // 10, jobs * 9 // 10
    start = end = None
    load_before = os.getloadavg()[0]
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            done = finished(client, broker, queue)
            if start is None and done >= lo:
                start = (time.perf_counter(), done, redis_cpu(nodes),
                         proc_cpu([p.pid for p in procs]), script_calls(nodes))
            if start is not None and done >= hi:
                end = (time.perf_counter(), done, redis_cpu(nodes),
                       proc_cpu([p.pid for p in procs]), script_calls(nodes))
                break
            time.sleep(0.02)
    finally:
        stop_processes(procs, grace=30)
    if start is None or end is None:
        raise RuntimeError(f"{shards} shards: the backlog was not drained in time")
    seconds, n = end[0] - start[0], end[1] - start[1]
    per_node = [round((b - a) / n * 1e6, 1) for a, b in zip(start[2], end[2], strict=True)]
    return {"shards": shards, "queue": queue, "jobs_per_s": round(n / seconds),
            "redis_cpu_us_per_job": round(sum(per_node), 1),
            "redis_cpu_us_per_job_per_node": per_node,
            "workers_cpu_us_per_job": round((end[3] - start[3]) / n * 1e6, 1),
            "script_calls_per_1000_jobs": round((end[4] - start[4]) / n * 1000, 1),
            "prefetch": prefetch, "shard_nodes": placement, "window_jobs": n,
            "load": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def median_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row from repeated runs: the median of each figure, the loads of all, and what
    those costs allow on more cores."""
    row = dict(runs[0])
    for key in ("jobs_per_s", "redis_cpu_us_per_job", "workers_cpu_us_per_job",
                "script_calls_per_1000_jobs", "window_jobs"):
        row[key] = statistics.median(r[key] for r in runs)
    row["redis_cpu_us_per_job_per_node"] = [
        statistics.median(r["redis_cpu_us_per_job_per_node"][i] for r in runs)
        for i in range(len(runs[0]["redis_cpu_us_per_job_per_node"]))]
    row["load"] = [min(r["load"][0] for r in runs), max(r["load"][1] for r in runs)]
    row["runs"] = len(runs)
    # The scaling model: each core gives 1 / (CPU per job) jobs a second, until the
    # busiest primary's one core (Redis runs scripts on one thread) is full.
    row["jobs_per_s_per_core"] = round(
        1e6 / (row["redis_cpu_us_per_job"] + row["workers_cpu_us_per_job"]))
    row["primaries_bound_jobs_per_s"] = round(1e6 / max(row["redis_cpu_us_per_job_per_node"]))
    return row


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"backlog per shard count (default {JOBS:,} x scale)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--prefetch", default="auto,16",
                        help="comma-separated: auto (adaptive) or a number of jobs")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout whose workers run each row too")
    parser.add_argument("--one-server", action="store_true",
                        help="the shards on one Redis server, not a cluster")
    options = parser.parse_args(argv)
    jobs = options.jobs or record.scaled(JOBS, options.scale, 2_000)
    prefetches = [None if p == "auto" else int(p) for p in options.prefetch.split(",")]
    sources: list[tuple[str, Path | None]] = [("current", None)]
    if options.baseline is not None:
        sources.insert(0, ("baseline", options.baseline.resolve()))
    # its own file: a one-server run never replaces the cluster's rows of the report
    this_run = record.Run("shards_one_server" if options.one_server else "shards",
                          options.scale)
    runs: dict[tuple[int | None, int, str], list[dict[str, Any]]] = {}
    with RedisServer() if options.one_server else RedisCluster(masters=3) as cluster:
        for _ in range(options.repeat):
            for prefetch in prefetches:
                for shards in (1, 2, 3):
                    for code, source in sources:
                        row = {**run(cluster, shards, jobs, options.workers, prefetch, source),
                               "code": code}
                        runs.setdefault((prefetch, shards, code), []).append(row)
                        print(json.dumps(row), flush=True)
    figures: dict[str, Any] = {"jobs": jobs, "workers": options.workers,
                               "rows": [median_row(r) for r in runs.values()]}
    if options.baseline is not None:
        figures["baseline"] = options.baseline.name
    this_run.write(options.out, figures)


if __name__ == "__main__":
    main()
