"""``MIN_REPLICAS`` on a Redis Cluster with replicas: each script and its ``WAIT`` share
one connection of the node serving the keys, whatever other threads send meanwhile, and
redirects (``MOVED``, ``ASK``) are followed there."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from django_delayq import DelayQConnectionError, NotReplicated
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.engine.urls import client_from_url
from tests.conftest import wait_until
from tests.servers import RedisCluster
from tests.test_cluster import slot_moving
from tests.testapp.tasks import record

pytestmark = pytest.mark.slow

QUEUE = "w"
SHARDED = "ws"
THREADS = 8
CALLS = 4  # per thread: CALLS single enqueues, then one bulk call over every shard


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    try:
        # A long node timeout: a replica stopped for a few seconds is not failed over.
        server = RedisCluster(replicas=1, node_timeout_ms=30_000).start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"could not start a 3-primary, 3-replica local Redis Cluster: {exc}")
    yield server
    server.cleanup()


def new_broker(cluster: RedisCluster, *, timeout_ms: int = 30_000,
               client: Any = None) -> Broker:
    """A broker asking one replica for each write, within ``timeout_ms`` (long by
    default: a running replica confirms however loaded the machine is); on ``client``
    (its connection pool) when given, else on a new client of an emptied cluster."""
    if client is None:
        client = client_from_url(cluster.seeds_url, decode_responses=True)
        client.flushall()
    return Broker(client, EngineConfig(min_replicas=1, min_replicas_timeout_ms=timeout_ms,
                                       queues={SHARDED: {"shards": 3}}))


def hammer(broker: Broker, label: str) -> list[str]:
    """Enqueue from THREADS threads at once through ``broker``: what each call did."""
    outcomes: list[str] = []
    start = threading.Barrier(THREADS)

    def produce(t: int) -> None:
        start.wait()
        for i in range(CALLS + 1):
            try:
                if i < CALLS:
                    broker.enqueue(QUEUE, record.name, [i], job_id=f"{label}-{t}-{i}")
                else:
                    broker.enqueue_many(SHARDED, [
                        EnqueueRequest(task=record.name, job_id=f"{label}-{t}-b{j}")
                        for j in range(6)])
            except NotReplicated:
                outcomes.append("NotReplicated")
            except BaseException as exc:
                outcomes.append(repr(exc))
            else:
                outcomes.append("returned")

    threads = [threading.Thread(target=produce, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    return outcomes


def on_replica(port: int, key: str) -> bool:
    """Whether the replica at ``port`` has ``key`` (read there, not redirected)."""
    with redis.Redis(port=port, single_connection_client=True) as client:
        client.execute_command("READONLY")
        return bool(client.exists(key))


def replica_caught_up(primary: int) -> bool:
    """Whether the primary's replica has acknowledged every write it was sent."""
    with redis.Redis(port=primary, decode_responses=True) as client:
        info = client.info("replication")
    return all(int(v["offset"]) == int(info["master_repl_offset"])
               for k, v in info.items() if k.startswith("slave") and isinstance(v, dict))


def test_threads_sharing_a_client_are_never_confirmed_by_a_stopped_replica(cluster):
    patient = new_broker(cluster)
    primary = cluster.primary_port_of(patient.shards(QUEUE)[0].ready)
    (replica,) = cluster.replicas_of(primary)
    assert replica.process is not None
    assert hammer(patient, "running") == ["returned"] * THREADS * (CALLS + 1)
    # The same client, so the same pooled connections; a short deadline, since the
    # stopped replica can never confirm.
    broker = new_broker(cluster, timeout_ms=200, client=patient.client)
    assert all(on_replica(replica.port, broker.keys_for(QUEUE, job_id).job(job_id))
               for job_id in (f"running-{t}-{i}" for t in range(THREADS) for i in range(CALLS)))
    # The pool now holds connections whose last writes the replica has: a WAIT sent on
    # one of them, apart from its script, would be confirmed at once.
    wait_until(lambda: replica_caught_up(primary), message="the replica to catch up")
    os.kill(replica.process.pid, signal.SIGSTOP)
    try:
        outcomes = hammer(broker, "stopped")
    finally:
        os.kill(replica.process.pid, signal.SIGCONT)
    assert outcomes == ["NotReplicated"] * THREADS * (CALLS + 1)
    # Written to the primary all the same.
    assert broker.client.exists(broker.keys_for(QUEUE, "stopped-0-0").job("stopped-0-0"))
    broker.client.close()


def asking_calls(port: int) -> int:
    stats = redis.Redis(port=port).info("commandstats")
    return int(stats.get("cmdstat_asking", {}).get("calls", 0))


def test_moved_and_ask_are_followed_and_the_job_confirmed_on_its_new_node(cluster):
    broker = new_broker(cluster)
    keys = broker.shards(QUEUE)[0]
    broker.enqueue(QUEUE, record.name, job_id="before")
    old = cluster.primary_port_of(keys.ready)
    admin = client_from_url(cluster.seeds_url, decode_responses=True)
    try:
        # Half moved, the shard's keys still on the old node: a job's new key is on
        # neither, so the script cannot run (TRYAGAIN) until the move ends.
        with (slot_moving(cluster, admin, broker.client.keyslot(keys.ready)),
              pytest.raises(DelayQConnectionError, match="TRYAGAIN")):
            broker.enqueue(QUEUE, record.name, job_id="during")
        # A queue with no key yet: the old node sends the call to the new one (ASK),
        # which cannot run a script over keys it does not all have either.
        fresh = broker.shards("fresh")[0]
        before = {port: asking_calls(port) for port in cluster.ports}
        with slot_moving(cluster, admin, broker.client.keyslot(fresh.ready)):
            with pytest.raises(DelayQConnectionError, match="TRYAGAIN"):
                broker.enqueue("fresh", record.name, job_id="asked")
            target = cluster.primary_port_of(fresh.ready)  # the old owner until the end
            assert sum(asking_calls(p) - before[p] for p in cluster.ports if p != target) == 1
    finally:
        admin.close()
    new = cluster.primary_port_of(keys.ready)
    assert new != old
    # The broker's client still maps both slots to their old nodes: MOVED, followed.
    assert broker.enqueue(QUEUE, record.name, job_id="after").added
    assert broker.enqueue("fresh", record.name, job_id="asked").added
    (replica,) = cluster.replicas_of(new)
    assert redis.Redis(port=new).exists(keys.job("after"))
    assert on_replica(replica.port, keys.job("after"))
    broker.client.close()
