"""Per-key flow control against plain jobs, on a throwaway Redis, one process.

    python -m bench.keyed [--scale 1] [--jobs 20000] [--baseline DIR ...]

Rows: claim-and-ack throughput (claims of 20, acks of 20, one round trip each) of
jobs without keys, of jobs of 1 key and of 10,000 keys (limits high enough never to
park), of 2 keys weighted 3:1, and of 1 key limited to 10 (parking and releasing every
job); the single enqueue rate of a plain job and of a debounced one (a replacement
each, the common case) and of a keyed one; Redis bytes per key. Each rate comes with
the microseconds Redis spent in the scripts per job (``INFO commandstats``), which
other work on the machine moves far less than a rate. ``--baseline DIR`` (repeatable)
also measures the rows without keys with the package of another checkout, in
alternating runs, each with the load average at its start. Writes ``keyed.json``.
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


def claim_row(broker: Broker, name: str, jobs: int, keys: int | None, limit: int,
              weights: tuple[int, ...] = ()) -> dict[str, float]:
    """Claim and ack ``jobs`` of ``keys`` keys (``weights``: the weight of key i is
    ``weights[i]``); jobs per second and Redis microseconds per job."""
    made = requests(jobs, keys, limit)
    if weights:
        from django_delayq.engine.keyed import KeyedOptions

        made = [EnqueueRequest(task="bench.noop", args=[i], keyed=KeyedOptions(
            f"k{i % len(weights)}", limit, weight=weights[i % len(weights)]))
            for i in range(jobs)]
    broker.enqueue_many(name, made)
    before = script_usec(broker.client)
    rate = drain(broker, name)
    return {"per_s": round(rate), "redis_us_per_job":
            round((script_usec(broker.client) - before) / jobs, 2), "load": load1()}


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def enqueue_rate(broker: Broker, jobs: int, keyed: Any = None) -> int:
    start = time.perf_counter()
    for i in range(jobs):
        if keyed is None:
            broker.enqueue("enq", "bench.noop", [i])
        else:
            broker.enqueue("enq", "bench.noop", [i], keyed=keyed,
                           delay=60 if keyed.dedupe_mode else None)
    return round(jobs / (time.perf_counter() - start))


def enqueue_rows(broker: Broker, jobs: int) -> dict[str, dict[str, float]]:
    """Single enqueues of plain, keyed and debounced jobs, in alternating blocks of 300
    (the median block of each, rate and Redis microseconds per enqueue apart), so a load
    that changes moves them alike."""
    from django_delayq.engine.keyed import encode

    kinds = {"enqueue_plain": None,
             "enqueue_keyed": encode("tenant", 100_000, None, None, None),
             "enqueue_debounced": encode(None, None, "digest", "debounce", 60)}
    rates: dict[str, list[int]] = {name: [] for name in kinds}
    usec: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(max(1, jobs // 300)):
        for name, keyed in kinds.items():
            before = script_usec(broker.client)
            rates[name].append(enqueue_rate(broker, 300, keyed))
            usec[name].append((script_usec(broker.client) - before) / 300)
    load = load1()
    return {name: {"per_s": median(rates[name]),
                   "redis_us_per_job": round(median(usec[name]), 2), "load": load}
            for name in kinds}


def median(values: list[Any]) -> Any:
    return sorted(values)[len(values) // 2]


def script_usec(client: redis.Redis) -> int:
    """Microseconds Redis spent in script calls so far (INFO commandstats)."""
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("usec", 0))
               for name in ("evalsha", "eval"))


def redis_cpu_us(client: redis.Redis) -> float:
    """CPU microseconds the Redis process used so far (INFO cpu, user + system)."""
    cpu = client.info("cpu")
    return (float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])) * 1e6


def plain_rows(broker: Broker, jobs: int) -> dict[str, float]:
    """The rows without keys; with the time Redis spent in the scripts per job (less
    moved by other processes than a rate)."""
    broker.enqueue("warm", "bench.noop", [0])
    broker.enqueue_many("plain", requests(jobs, None, 0))
    hash_bytes = sampled_memory(broker, "plain", "ready")
    before, cpu = script_usec(broker.client), redis_cpu_us(broker.client)
    rate = drain(broker, "plain")
    claim_us = (script_usec(broker.client) - before) / jobs
    claim_cpu = (redis_cpu_us(broker.client) - cpu) / jobs
    before, cpu = script_usec(broker.client), redis_cpu_us(broker.client)
    enqueue = enqueue_rate(broker, jobs // 4)
    enqueue_us = (script_usec(broker.client) - before) / (jobs // 4)
    enqueue_cpu = (redis_cpu_us(broker.client) - cpu) / (jobs // 4)
    return {"claim_no_keys_per_s": round(rate), "enqueue_plain_per_s": enqueue,
            "claim_ack_redis_us_per_job": round(claim_us, 2),
            "enqueue_redis_us_per_job": round(enqueue_us, 2),
            "claim_ack_redis_cpu_us_per_job": round(claim_cpu, 2),
            "enqueue_redis_cpu_us_per_job": round(enqueue_cpu, 2),
            "ready_job_hash_bytes": hash_bytes, "load": load1()}


def sampled_memory(broker: Broker, queue: str, set_name: str, count: int = 200) -> float:
    """MEMORY USAGE of the hashes of the first ``count`` jobs of the set ``set_name``
    ("ready", "active") of ``queue``, on average."""
    keys = broker.shards(queue)[0]
    ids = broker.client.zrange(getattr(keys, set_name), 0, count - 1)
    found = [broker.client.memory_usage(keys.job(job_id), samples=0) or 0 for job_id in ids]
    return round(sum(found) / len(found), 1) if found else 0.0


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
    plain_hash = sampled_memory(broker, "mem", "active")
    client.flushall()
    base = client.info("memory")["used_memory"]
    broker.enqueue_many("mem", [EnqueueRequest(task="bench.noop", args=[i],
                                               keyed=KeyedOptions(f"k{i % keys}", 1))
                                for i in range(2 * keys)])
    while broker.claim("mem", 1_000, "bench")[0].jobs:
        pass
    keyed = client.info("memory")["used_memory"] - base
    keyed_hash = sampled_memory(broker, "mem", "active")
    shard = broker.shards("mem")[0]
    structures = [shard.key_active, shard.key_waiting, shard.key_turns,
                  *(shard.parked(f"k{i}") for i in range(keys))]
    pipe = client.pipeline(transaction=False)
    for name in structures:
        pipe.memory_usage(name, samples=0)
    per_key_structures = sum(n or 0 for n in pipe.execute())
    client.flushall()
    base = client.info("memory")["used_memory"]
    for i in range(keys):
        broker.enqueue("mem", "bench.noop", [i], delay=60,
                       keyed=encode(None, None, f"d{i}", "debounce", 60))
    debounced = client.info("memory")["used_memory"] - base
    records = [client.memory_usage(shard.dedupe(f"d{i}"), samples=0) or 0 for i in range(200)]
    client.flushall()
    base = client.info("memory")["used_memory"]
    for i in range(keys):
        broker.enqueue("mem", "bench.noop", [i], delay=60)
    delayed = client.info("memory")["used_memory"] - base
    return {"keyed_over_plain_bytes_per_key": round((keyed - plain) / keys, 1),
            "dedupe_record_bytes_per_key": round((debounced - delayed) / keys, 1),
            # MEMORY USAGE, exact per key rather than a difference of used_memory:
            # the key's count in the active and waiting ZSETs, its turn, its parked ZSET
            "memory_usage_key_structures_bytes_per_key": round(per_key_structures / keys, 1),
            "memory_usage_dedupe_record_bytes": round(sum(records) / len(records), 1),
            "memory_usage_claimed_job_hash_bytes": {"plain": plain_hash, "keyed": keyed_hash}}


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"jobs per row (default {JOBS:,} x scale)")
    parser.add_argument("--baseline", action="append", default=[],
                        help="another checkout: its rows without keys, for a before/after "
                             "(repeatable)")
    parser.add_argument("--rounds", type=int, default=5,
                        help="alternating runs of each checkout with --baseline")
    parser.add_argument("--plain-only", action="store_true", help=argparse_hidden())
    opts = parser.parse_args(argv)
    jobs = opts.jobs or record.scaled(JOBS, opts.scale, 1_000)
    run = record.Run("keyed", opts.scale)  # the load and time at the start, too
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url, decode_responses=True)
        broker = Broker(client, EngineConfig())
        if opts.plain_only:
            print(json.dumps(plain_rows(broker, jobs)))
            return
        rows: dict[str, Any] = plain_rows(broker, jobs)
        # the claim rows alternate with a row without keys, so a changing load moves
        # them alike; the medians of 3 rounds
        claims: dict[str, list[dict[str, float]]] = {}
        for _ in range(3):
            for name, keys, limit, weights in (
                    ("claim_no_keys", None, 0, ()), ("claim_1_key", 1, 100_000, ()),
                    ("claim_10000_keys", 10_000, 100_000, ()),
                    ("claim_2_keys_weighted_3_1", 2, 100_000, (3, 1)),
                    ("claim_1_key_limit_10", 1, 10, ())):
                claims.setdefault(name, []).append(
                    claim_row(broker, name, jobs, keys, limit, weights))
        for name, found in claims.items():
            rows[name] = {field: median([row[field] for row in found]) for field in found[0]}
        rows.update(enqueue_rows(broker, jobs))
        rows.update(bytes_per_key(client, broker, 10_000))
        client.close()
    if opts.baseline:
        # Each checkout's rows without keys in a process of its own, alternating, the
        # median of each: a loaded machine moves both alike.
        checkouts = {"this": str(Path.cwd()),
                     **{f"baseline_{Path(b).name}": b for b in opts.baseline}}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in checkouts}
        for _ in range(opts.rounds):
            for name, checkout in checkouts.items():
                runs[name].append(plain_in(checkout, jobs))
        for name, found in runs.items():
            rows[f"{name}_median"] = {key: median([r[key] for r in found])
                                      for key in found[0]}
            rows[f"{name}_runs"] = found
    rows["jobs"] = jobs
    for name, value in rows.items():
        print(f"{name:34} {value}")
    run.write(opts.out, rows)


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
