"""enqueue_many against one enqueue per job, on a throwaway Redis.

    .venv/bin/python bench/bulk_enqueue.py [--jobs 100000] [--chunk 1000]

Both paths go through the engine (`Broker.enqueue` / `Broker.enqueue_many`) with the
same no-op payload; round trips are counted with INFO commandstats (EVALSHA calls).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis

from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.testing import RedisServer


def evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=1_000)
    opts = parser.parse_args()
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        broker = Broker(client, EngineConfig())
        broker.enqueue("warm", "bench.noop", [0])  # loads the script

        before, start = evalsha_calls(client), time.perf_counter()
        bulk = broker.enqueue_many(
            "bulk", (EnqueueRequest(task="bench.noop", args=[i]) for i in range(opts.jobs)),
            chunk_size=opts.chunk)
        bulk_s, bulk_calls = time.perf_counter() - start, evalsha_calls(client) - before
        assert bulk.enqueued == opts.jobs

        before, start = evalsha_calls(client), time.perf_counter()
        for i in range(opts.jobs):
            broker.enqueue("single", "bench.noop", [i])
        single_s, single_calls = time.perf_counter() - start, evalsha_calls(client) - before

    load = os.getloadavg()[0]
    print(f"{opts.jobs:,} jobs, chunk {opts.chunk:,}, load average {load:.2f}")
    print(f"enqueue_many: {bulk_s:6.2f} s  {opts.jobs / bulk_s:9,.0f} jobs/s  "
          f"{bulk_calls:,} round trips")
    print(f"enqueue x N : {single_s:6.2f} s  {opts.jobs / single_s:9,.0f} jobs/s  "
          f"{single_calls:,} round trips")
    print(f"speed-up    : {single_s / bulk_s:.1f}x")


if __name__ == "__main__":
    main()
