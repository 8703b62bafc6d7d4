"""The cost of ``MIN_REPLICAS``: single and bulk enqueues with 1 against 0, on a
throwaway primary with one replica (both on loopback, like the rest of the bench).

    python -m bench.replicas [--scale 1]

With ``MIN_REPLICAS=1`` each enqueue sends Redis ``WAIT 1`` in the same round trip as
its script (a bulk enqueue: once per chunk of 1,000), so it returns once the replica
has acknowledged the job: the extra cost is the replica's acknowledgement, not a
second round trip. The two settings are timed in alternating blocks of 100 calls (the
bulk: one chunk each), so machine drift weighs on both alike. ``make bench`` runs it
after the libraries (``bench.run``) and reports it as its own table.
"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from bench import record, tables
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.testing import RedisServer
from tests.servers import REPLICATION_ARGS

BASE = {"single_n": 5_000, "bulk_n": 20_000}
BLOCK = 100
CHUNK = 1_000


def _wait_online(primary: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = primary.info("replication")
        if any(isinstance(v, dict) and v.get("state") == "online"
               for k, v in info.items() if k.startswith("slave")):
            return
        time.sleep(0.05)
    raise RuntimeError("the replica did not come online")


def measure(scale: float = 1.0) -> dict[str, Any]:
    """Jobs per second for each setting, and the ratio of MIN_REPLICAS=1 to 0."""
    single_n = max(BLOCK * 2, int(BASE["single_n"] * scale) // BLOCK * BLOCK)
    bulk_n = max(CHUNK * 2, int(BASE["bulk_n"] * scale) // CHUNK * CHUNK)
    with RedisServer(extra_args=REPLICATION_ARGS) as primary_server, RedisServer(
            extra_args=REPLICATION_ARGS) as replica:
        client = redis.Redis.from_url(primary_server.url, decode_responses=True)
        redis.Redis(port=replica.port).execute_command(
            "REPLICAOF", "127.0.0.1", primary_server.port)
        _wait_online(client)
        brokers = {n: Broker(client, EngineConfig(min_replicas=n, min_replicas_timeout_ms=5000))
                   for n in (0, 1)}
        for broker in brokers.values():
            broker.enqueue("warm", "bench.noop", [0])
        spent = {("single", n): 0.0 for n in (0, 1)} | {("bulk", n): 0.0 for n in (0, 1)}
        for block in range(single_n // BLOCK):
            for n in ((0, 1) if block % 2 else (1, 0)):
                start = time.perf_counter()
                for _ in range(BLOCK):
                    brokers[n].enqueue("single", "bench.noop", [0])
                spent["single", n] += time.perf_counter() - start
        for chunk in range(bulk_n // CHUNK):
            for n in ((0, 1) if chunk % 2 else (1, 0)):
                requests = [EnqueueRequest(task="bench.noop", args=[0]) for _ in range(CHUNK)]
                start = time.perf_counter()
                brokers[n].enqueue_many("bulk", requests, chunk_size=CHUNK)
                spent["bulk", n] += time.perf_counter() - start
        client.close()
    out: dict[str, Any] = {"single_n": single_n, "bulk_n": bulk_n}
    for kind, n_jobs in (("single", single_n), ("bulk", bulk_n)):
        for n in (0, 1):
            out[f"{kind}_per_s_min_replicas_{n}"] = n_jobs / spent[kind, n]
        out[f"{kind}_ratio"] = spent[kind, 0] / spent[kind, 1]
    return out


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    figures = measure(parser.parse_args(argv).scale)
    print(json.dumps(figures, indent=2))
    print("\n".join(tables.replication(figures)))


if __name__ == "__main__":
    main()
