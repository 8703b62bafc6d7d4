"""Concurrency keys on a Redis Cluster of 3 primaries with a replica each, through
``runworker`` processes (threads, and a pool of worker processes): a key's limit holds
while the other keys run, and a killed worker's slot frees when its lease lapses."""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from django_delayq import Job
from django_delayq.engine import Broker
from tests.conftest import kill_with_children, wait_until
from tests.servers import RedisCluster
from tests.testapp.keyed_tasks import BESIDE, PEAK, RUNNING, RUNS, per_tenant

pytestmark = pytest.mark.slow

QUEUE = "keyed"
SHARDS = 4
SETTINGS = {"QUEUES": {QUEUE: {"shards": SHARDS}}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    try:
        server = RedisCluster(masters=3, replicas=1).start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"could not start a local Redis Cluster of 6 redis-server processes: "
                    f"{exc}")
    yield server
    server.cleanup()


@pytest.fixture
def on_cluster(settings: Any, cluster: RedisCluster) -> Broker:
    """Settings pointing at the cluster, emptied first; returns the broker."""
    from django_delayq.connection import get_broker

    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": cluster.url, **SETTINGS}
    broker = get_broker()
    assert broker.is_cluster
    broker.client.flushall()  # every primary
    return broker


def workers(spawned: Any, cluster: RedisCluster, *args: str) -> Any:
    return spawned(QUEUE, *args, redis_url=cluster.url,
                   env={"DELAYQ_TEST_SETTINGS": json.dumps(SETTINGS)})


class Sampler(threading.Thread):
    """Every 2 ms: the slots ``key`` holds in its shard, and the jobs of ``key`` in
    its bodies; keeps the highest of each."""

    def __init__(self, broker: Broker, key: str) -> None:
        super().__init__(daemon=True)
        self.client, self.key = broker.client, key
        self.home = broker.shards(QUEUE)[zlib.crc32(key.encode()) % SHARDS]
        self.stop = threading.Event()
        self.slots = self.running = self.samples = 0

    def run(self) -> None:
        while not self.stop.is_set():
            slots = int(float(self.client.zscore(self.home.key_active, self.key) or 0))
            running = int(self.client.hget(RUNNING, self.key) or 0)
            self.slots = max(self.slots, slots)
            self.running = max(self.running, running)
            self.samples += 1
            time.sleep(0.002)

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.join()


def no_slot_held(broker: Broker) -> bool:
    client = broker.client
    return all(client.zcard(k.key_active) == 0 and client.zcard(k.key_waiting) == 0
               for k in broker.shards(QUEUE))


def test_a_keys_limit_holds_on_a_cluster_with_replicas_while_other_keys_run(
        on_cluster, cluster, spawned):
    """3,000 jobs: 900 of key A (limit 2) and 2,100 of 30 other keys, run by three
    runworker processes (4 threads, 4 threads, a pool of 2 processes of 3 threads).
    A never holds more than 2 slots nor runs more than 2 bodies, and while it runs 2 the
    other keys run beside it."""
    client = on_cluster.client
    heavy = [(f"A:{i}", 0.002) for i in range(900)]
    others = [(f"B{i % 30}:{i}", 0.002) for i in range(2100)]
    per_tenant.using(queue=QUEUE).enqueue_many(heavy + others)
    with Sampler(on_cluster, "A") as sampler:
        workers(spawned, cluster, "-c", "4")
        workers(spawned, cluster, "-c", "4")
        workers(spawned, cluster, "-c", "3", "--processes", "2")
        wait_until(lambda: client.llen(RUNS) >= 3000, timeout=600, interval=0.2,
                   message="3,000 keyed jobs run")
        wait_until(lambda: no_slot_held(on_cluster), timeout=60,
                   message="every slot handed back")
    peaks = {key: int(value) for key, value in client.hgetall(PEAK).items()}
    print(f"samples={sampler.samples} slots={sampler.slots} running={sampler.running} "
          f"beside={client.hget(BESIDE, 'A')} peak of every key={peaks['*']}")
    assert client.llen(RUNS) == 3000
    assert peaks["A"] == 2
    assert all(peak <= 2 for key, peak in peaks.items() if key != "*")
    assert sampler.samples > 100
    assert sampler.slots == 2
    assert sampler.running == 2
    # Other keys ran while A ran at its limit: counted by the bodies as each A job took A
    # to 2 (a sample every few ms can miss those moments on a busy machine).
    assert int(client.hget(BESIDE, "A") or 0) >= 1


def test_a_killed_workers_slot_frees_after_its_lease_on_a_cluster(on_cluster, cluster,
                                                                   spawned):
    """A runworker with a pool of 2 processes is killed (host and pool) while a job of
    key K (limit 1) runs; the next job of K starts only once that lease lapsed, the
    killed job runs again, and no slot is left held."""
    client = on_cluster.client
    one = per_tenant.using(queue=QUEUE, concurrency_limit=1)
    proc, _ = workers(spawned, cluster, "-c", "2", "--processes", "2", "--lease", "3")
    first = one.enqueue("K:1", 0.0, "{test:keyed}:gate")
    second = one.enqueue("K:2")
    keys = on_cluster.keys_for(QUEUE, first.id)
    assert keys == on_cluster.keys_for(QUEUE, second.id)  # a key's jobs share a shard
    with Sampler(on_cluster, "K") as sampler:
        wait_until(lambda: client.llen(RUNS) == 1, timeout=120, message="the first job ran")
        kill_with_children(proc)  # nobody hands the lease back
        client.hset(RUNNING, "K", 0)  # the killed body never counted itself out
        deadline = float(client.zscore(keys.active, first.id))
        assert Job.fetch(second.id, QUEUE).status == "ready"  # parked behind K's slot
        client.set("{test:keyed}:gate", 1)
        workers(spawned, cluster, "-c", "2", "--processes", "2", "--lease", "3")
        wait_until(lambda: Job.fetch(second.id, QUEUE).status == "completed", timeout=120,
                   message="the second job ran after the lease lapsed")
        wait_until(lambda: Job.fetch(first.id, QUEUE).status == "completed", timeout=120,
                   message="the killed job ran again")
        wait_until(lambda: no_slot_held(on_cluster), timeout=60,
                   message="every slot handed back")
    started = Job.fetch(second.id, QUEUE).started_at
    assert started is not None
    assert started.timestamp() * 1000 >= deadline  # never before the lease lapsed
    assert [a["outcome"] for a in Job.fetch(first.id, QUEUE).attempt_log] == [
        "reclaimed", "completed"]
    assert sampler.slots == 1
    assert sampler.running == 1
