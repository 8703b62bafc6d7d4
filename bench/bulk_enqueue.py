"""enqueue_many against one enqueue per job, on a throwaway Redis.

    python -m bench.bulk_enqueue [--scale 1] [--jobs 100000] [--chunk 1000]

Both paths go through the engine (`Broker.enqueue` / `Broker.enqueue_many`) with the
same no-op payload; round trips are counted with INFO commandstats (EVALSHA calls).
Writes ``bulk_enqueue.json`` (in ``--out``).
"""

from __future__ import annotations

import time

import redis

from bench import record
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.testing import RedisServer

JOBS = 100_000


def evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"jobs each way (default {JOBS:,} x scale)")
    parser.add_argument("--chunk", type=int, default=1_000)
    opts = parser.parse_args(argv)
    jobs = opts.jobs or record.scaled(JOBS, opts.scale, 1_000)
    this_run = record.Run("bulk_enqueue", opts.scale)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        broker = Broker(client, EngineConfig())
        broker.enqueue("warm", "bench.noop", [0])  # loads the script

        before, start = evalsha_calls(client), time.perf_counter()
        bulk = broker.enqueue_many(
            "bulk", (EnqueueRequest(task="bench.noop", args=[i]) for i in range(jobs)),
            chunk_size=opts.chunk)
        bulk_s, bulk_calls = time.perf_counter() - start, evalsha_calls(client) - before
        assert bulk.enqueued == jobs

        before, start = evalsha_calls(client), time.perf_counter()
        for i in range(jobs):
            broker.enqueue("single", "bench.noop", [i])
        single_s, single_calls = time.perf_counter() - start, evalsha_calls(client) - before
        client.close()

    print(f"{jobs:,} jobs, chunk {opts.chunk:,}, load average {record.load()[0]:.2f}")
    print(f"enqueue_many: {bulk_s:6.2f} s  {jobs / bulk_s:9,.0f} jobs/s  "
          f"{bulk_calls:,} round trips")
    print(f"enqueue x N : {single_s:6.2f} s  {jobs / single_s:9,.0f} jobs/s  "
          f"{single_calls:,} round trips")
    print(f"speed-up    : {single_s / bulk_s:.1f}x")
    this_run.write(opts.out, {
        "jobs": jobs, "chunk": opts.chunk,
        "enqueue_many": {"seconds": round(bulk_s, 3), "jobs_per_s": round(jobs / bulk_s),
                         "round_trips": bulk_calls},
        "enqueue": {"seconds": round(single_s, 3), "jobs_per_s": round(jobs / single_s),
                    "round_trips": single_calls},
        "speed_up": round(single_s / bulk_s, 2),
    })


if __name__ == "__main__":
    main()
