"""Per-key flow control against plain jobs, on a throwaway Redis, one process.

    python -m bench.keyed [--scale 1] [--jobs 20000] [--baseline DIR]

Rows: claim-and-ack throughput (claims of 20, acks of 20, one round trip each) of
jobs without keys, of jobs of 1 key and of 10,000 keys (limits high enough never to
park), and of 1 key limited to 10 (parking and releasing every job); the single
enqueue rate of a plain job and of a debounced one (a replacement each, the common
case) and of a keyed one; Redis bytes per key. ``--baseline DIR`` also times the rows
without keys with the package of another checkout (before/after). Writes ``keyed.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from bench import record
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.testing import RedisServer

JOBS = 20_000
BATCH = 20


def drain(broker: Broker, queue: str) -> float:
    """Claim and ack ``queue`` to the end; jobs per second."""
    done, start = 0, time.perf_counter()
    while True:
        jobs = [job for res in broker.claim(queue, BATCH, "bench") for job in res.jobs]
        if not jobs:
            break
        batch = broker.batch()
        broker.add_complete(batch, jobs[0].keys, [(j.id, j.attempt, "null") for j in jobs])
        batch.run()
        done += len(jobs)
    return done / (time.perf_counter() - start)


def requests(jobs: int, keys: int | None, limit: int) -> list[EnqueueRequest]:
    if keys is None:
        return [EnqueueRequest(task="bench.noop", args=[i]) for i in range(jobs)]
    from django_delayq.engine.keyed import KeyedOptions

    return [EnqueueRequest(task="bench.noop", args=[i],
                           keyed=KeyedOptions(f"k{i % keys}", limit)) for i in range(jobs)]


def claim_rate(broker: Broker, name: str, jobs: int, keys: int | None, limit: int) -> int:
    broker.enqueue_many(name, requests(jobs, keys, limit))
    return round(drain(broker, name))


def enqueue_rate(broker: Broker, jobs: int, keyed: Any = None) -> int:
    start = time.perf_counter()
    for i in range(jobs):
        if keyed is None:
            broker.enqueue("enq", "bench.noop", [i])
        else:
            broker.enqueue("enq", "bench.noop", [i], keyed=keyed,
                           delay=60 if keyed.dedupe_mode else None)
    return round(jobs / (time.perf_counter() - start))


def enqueue_rows(broker: Broker, jobs: int) -> dict[str, int]:
    """Single enqueues of plain, keyed and debounced jobs, in alternating blocks of 300
    (the median block of each), so a load that changes moves them alike."""
    from django_delayq.engine.keyed import encode

    kinds = {"enqueue_plain_per_s": None,
             "enqueue_keyed_per_s": encode("tenant", 100_000, None, None, None),
             "enqueue_debounced_per_s": encode(None, None, "digest", "debounce", 60)}
    rates: dict[str, list[int]] = {name: [] for name in kinds}
    for _ in range(max(1, jobs // 300)):
        for name, keyed in kinds.items():
            rates[name].append(enqueue_rate(broker, 300, keyed))
    return {name: sorted(found)[len(found) // 2] for name, found in rates.items()}


def script_usec(client: redis.Redis) -> int:
    """Microseconds Redis spent in script calls so far (INFO commandstats)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0))
               for name in ("evalsha", "eval"))


def plain_rows(broker: Broker, jobs: int) -> dict[str, float]:
    """The rows without keys; with the time Redis spent in the scripts per job (less
    moved by other processes than a rate)."""
    broker.enqueue("warm", "bench.noop", [0])
    broker.enqueue_many("plain", requests(jobs, None, 0))
    before = script_usec(broker.client)
    rate = drain(broker, "plain")
    claim_us = (script_usec(broker.client) - before) / jobs
    before = script_usec(broker.client)
    enqueue = enqueue_rate(broker, jobs // 4)
    enqueue_us = (script_usec(broker.client) - before) / (jobs // 4)
    return {"claim_no_keys_per_s": round(rate), "enqueue_plain_per_s": enqueue,
            "claim_ack_redis_us_per_job": round(claim_us, 2),
            "enqueue_redis_us_per_job": round(enqueue_us, 2)}


def bytes_per_key(client: redis.Redis, broker: Broker, keys: int) -> dict[str, float]:
    """Memory of ``keys`` keys, each with 2 jobs, one running and one waiting for its
    slot, over the same jobs without keys; and of a dedupe record."""
    from django_delayq.engine.keyed import KeyedOptions, encode

    client.flushall()
    base = client.info("memory")["used_memory"]
    broker.enqueue_many("mem", requests(2 * keys, None, 0))
    while broker.claim("mem", 1_000, "bench")[0].jobs:
        pass
    plain = client.info("memory")["used_memory"] - base
    client.flushall()
    base = client.info("memory")["used_memory"]
    broker.enqueue_many("mem", [EnqueueRequest(task="bench.noop", args=[i],
                                               keyed=KeyedOptions(f"k{i % keys}", 1))
                                for i in range(2 * keys)])
    while broker.claim("mem", 1_000, "bench")[0].jobs:
        pass
    keyed = client.info("memory")["used_memory"] - base
    client.flushall()
    base = client.info("memory")["used_memory"]
    for i in range(keys):
        broker.enqueue("mem", "bench.noop", [i], delay=60,
                       keyed=encode(None, None, f"d{i}", "debounce", 60))
    debounced = client.info("memory")["used_memory"] - base
    client.flushall()
    base = client.info("memory")["used_memory"]
    for i in range(keys):
        broker.enqueue("mem", "bench.noop", [i], delay=60)
    delayed = client.info("memory")["used_memory"] - base
    return {"keyed_over_plain_bytes_per_key": round((keyed - plain) / keys, 1),
            "dedupe_record_bytes_per_key": round((debounced - delayed) / keys, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"jobs per row (default {JOBS:,} x scale)")
    parser.add_argument("--baseline", default=None,
                        help="another checkout: its rows without keys, for a before/after")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating runs of each checkout with --baseline")
    parser.add_argument("--plain-only", action="store_true", help=argparse_hidden())
    opts = parser.parse_args(argv)
    jobs = opts.jobs or record.scaled(JOBS, opts.scale, 1_000)
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        broker = Broker(client, EngineConfig())
        if opts.plain_only:
            print(json.dumps(plain_rows(broker, jobs)))
            return
        rows: dict[str, Any] = plain_rows(broker, jobs)
        rows["claim_1_key_per_s"] = claim_rate(broker, "one", jobs, 1, 100_000)
        rows["claim_10000_keys_per_s"] = claim_rate(broker, "many", jobs, 10_000, 100_000)
        rows["claim_1_key_limit_10_per_s"] = claim_rate(broker, "parked", jobs, 1, 10)
        rows.update(enqueue_rows(broker, jobs))
        rows.update(bytes_per_key(client, broker, 10_000))
        client.close()
    if opts.baseline:
        # Each checkout's rows without keys in a process of its own, alternating, the
        # median of each: a loaded machine moves both alike.
        runs: dict[str, list[dict[str, float]]] = {"this": [], "baseline": []}
        for _ in range(opts.rounds):
            for name, checkout in (("this", str(Path.cwd())), ("baseline", opts.baseline)):
                runs[name].append(plain_in(checkout, jobs))
        for name, found in runs.items():
            rows[f"{name}_median"] = {key: sorted(r[key] for r in found)[len(found) // 2]
                                      for key in found[0]}
    rows["jobs"] = jobs
    for name, value in rows.items():
        print(f"{name:34} {value}")
    record.Run("keyed", opts.scale).write(opts.out, rows)


def plain_in(checkout: str, jobs: int) -> dict[str, float]:
    """The rows without keys, timed with the package of ``checkout``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([checkout, str(Path.cwd())]))
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--plain-only",
                          "--jobs", str(jobs)], env=env, cwd=checkout,
                         capture_output=True, text=True, check=True)
    found: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
