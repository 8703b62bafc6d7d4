"""A sharded queue's scaling on a local 3-primary Redis Cluster: 1, 2 and 3 shards.

    python -m bench.shards [--scale 1] [--jobs 60000] [--workers 2]

For each shard count, the same backlog of no-op jobs (``tests.testapp.tasks.add``) is
enqueued into one queue (named so that its shards sit on different primaries) with
``SHARDS`` set to that count, then drained by the same
worker processes (``runworker --concurrency 8 --no-mirror``, the shards' keys spread
over the cluster's slots). Jobs per second are timed from the 10th to the 90th percent
of the backlog finished (start-up and tail left out); over that window the cluster's
Redis CPU (``INFO cpu`` of every primary) and the workers' CPU (``/proc``) are divided
by the jobs finished in it. Writes ``shards.json`` (in ``--out``) with the load averages.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from bench import record
from bench.harness.processes import proc_stat, start_process, stop_processes
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.engine.urls import client_from_url
from django_delayq.testing import RedisCluster

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
    return sum(st.cpu_s for pid in pids if (st := proc_stat(pid)) is not None)


def spread_queue(client: Any) -> str:
    """A queue name whose 3 shards (and so also its first 2) sit on 3 different
    primaries: a shard's node follows from its name's hash slot."""
    for n in range(1000):
        name = f"bench{n}"
        nodes = [client.get_node_from_key(k.ready).port for k in
                 Broker(client, EngineConfig(shards={name: 3})).shards(name)]
        if len(set(nodes)) == 3:
            return name
    raise RuntimeError("no queue name spreads its shards over the 3 primaries")


def finished(client: Any, broker: Broker, queue: str) -> int:
    return sum(int(client.hget(k.stats, "c") or 0) for k in broker.shards(queue))


def run(cluster: RedisCluster, shards: int, jobs: int, workers: int) -> dict[str, Any]:
    import redis

    client = client_from_url(cluster.url, decode_responses=True)
    queue = spread_queue(client)
    for node in cluster.nodes:
        redis.Redis(port=node.port).flushall()
    broker = Broker(client, EngineConfig(shards={queue: shards}))
    broker.enqueue_many(queue, (EnqueueRequest(task=TASK, args=[i, 1]) for i in range(jobs)))
    client.sadd(broker.global_keys.queues, queue)
    placement = [client.get_node_from_key(k.ready).port for k in broker.shards(queue)]
    nodes = [redis.Redis(port=n.port) for n in cluster.nodes]
    env = {"DJANGO_SETTINGS_MODULE": "tests.settings", "DELAYQ_TEST_REDIS_URL": cluster.url,
           "DELAYQ_TEST_SETTINGS": json.dumps({"SHARDS": {queue: shards}})}
    procs = [start_process([sys.executable, "-m", "django", "runworker", queue, "--concurrency",
                            "8", "--no-mirror", "-v", "0"], f"shards-{shards}-{i}", env)
             for i in range(workers)]
    lo, hi = jobs // 10, jobs * 9 // 10
    start = end = None
    load_before = os.getloadavg()[0]
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            done = finished(client, broker, queue)
            if start is None and done >= lo:
                start = (time.perf_counter(), done, redis_cpu(nodes),
                         proc_cpu([p.pid for p in procs]))
            if start is not None and done >= hi:
                end = (time.perf_counter(), done, redis_cpu(nodes),
                       proc_cpu([p.pid for p in procs]))
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
            "shard_nodes": placement, "window_jobs": n,
            "load": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"backlog per shard count (default {JOBS:,} x scale)")
    parser.add_argument("--workers", type=int, default=2)
    options = parser.parse_args(argv)
    jobs = options.jobs or record.scaled(JOBS, options.scale, 2_000)
    this_run = record.Run("shards", options.scale)
    rows = []
    with RedisCluster(masters=3) as cluster:
        for shards in (1, 2, 3):
            rows.append(run(cluster, shards, jobs, options.workers))
            print(json.dumps(rows[-1]), flush=True)
    this_run.write(options.out, {"jobs": jobs, "workers": options.workers, "rows": rows})


if __name__ == "__main__":
    main()
