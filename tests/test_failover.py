"""A primary SIGKILLed under load: Sentinel and a Cluster with replicas fail over while
producers enqueue and ``runworker`` processes (with their mirror processes) run jobs.

Each run counts what producers were told was enqueued, what Redis still holds after
the failover, what ran, what ran twice, whether anything started before its run_at, and
the mirror's rows of jobs Redis lost; it times the first enqueue and the first job
completed after the kill, and writes the failover's sequence (the sentinels' events, or
the Cluster's node table as it changed) to ``test-artifacts/failover/``. It adds a row to
the fault summary (``fault_report``). With ``MIN_REPLICAS=1`` nothing that returned may
be lost; with 0 the loss is measured, not asserted. Figures go to docs/guarantees.md.
The load, the measures and the checks are in ``tests/failover_load.py``.
"""

from __future__ import annotations

import time

import pytest
import redis

from django_delayq import DelayQConnectionError
from django_delayq.engine import Broker, EngineConfig
from django_delayq.engine.urls import client_from_url
from django_delayq.testing import RedisServer, free_port
from tests.conftest import wait_until
from tests.failover_checks import Scraper
from tests.failover_load import (
    FAILOVER_RETRY,
    QUEUE,
    QUEUE_0,
    REPLICA_TIMEOUT,
    AfterSwitch,
    ClusterWatch,
    Producers,
    Timeline,
    check_after_settle,
    check_promises,
    engine_config,
    migrated_db,
    mirror_db,
    note_sentinel_events,
    release_held,
    report,
    settle,
    workers,
)
from tests.servers import REPLICATION_ARGS, RedisCluster, RedisSentinelGroup
from tests.testapp.fault_tasks import count_run

pytestmark = pytest.mark.slow
__all__ = ["migrated_db", "mirror_db", "workers"]  # fixtures, found by pytest here


def demote_by_sentinel(timeline: Timeline, group: RedisSentinelGroup) -> None:
    """``SENTINEL FAILOVER``: the primary stays up, a replica is promoted, and the old
    primary goes on taking writes until a sentinel turns it into a replica (seconds
    later), when it drops what it took meanwhile."""
    timeline.killed_at = time.time()
    with redis.Redis(port=group.sentinels[0].port, socket_timeout=5) as sentinel:
        sentinel.execute_command("SENTINEL FAILOVER", group.service)


def demoted(server: RedisServer) -> bool:
    """Whether ``server`` is a replica in sync with its primary (what it took as a
    primary after the switch is gone by then)."""
    with redis.Redis(port=server.port, decode_responses=True, socket_timeout=5) as client:
        info = client.info("replication")
    return info.get("role") == "slave" and info.get("master_link_status") == "up"


@pytest.mark.parametrize("kind", ["kill", "failover"])
def test_sentinel_primary_killed_under_load(mirror_db, workers, fault_report, kind):
    """One SIGKILL of the primary (``kill``) or one ``SENTINEL FAILOVER`` (``failover``,
    the old primary alive), two sets of producers (2,500 jobs each), each on its own
    queue: MIN_REPLICAS=1 (nothing that returned may be lost) and MIN_REPLICAS=0 (the
    loss is counted)."""
    timeline = Timeline(f"sentinel-{kind}")
    # Two replicas: after the failover one is left to confirm MIN_REPLICAS=1 writes.
    with RedisSentinelGroup(replicas=2) as group:
        url = group.url()
        settings = {"MIN_REPLICAS": 1, "MIN_REPLICAS_TIMEOUT": REPLICA_TIMEOUT,
                    "FAILOVER_RETRY": FAILOVER_RETRY}
        procs = [workers(url, mirror_db, settings) for _ in range(2)]
        for _, out in procs:
            out.wait_for("mirror started", timeout=60)
        client = client_from_url(url, decode_responses=True, socket_timeout=5)
        durable = Producers(Broker(client, engine_config(1)), "m1")
        fast = Producers(Broker(client, engine_config(0)), "m0", queue=QUEUE_0)
        sets, found = {1: durable, 0: fast}, AfterSwitch()
        # A web process of its own: its client is not the producers'.
        scraper = Scraper(Broker(client_from_url(url, decode_responses=True, socket_timeout=5),
                                 engine_config(0))).__enter__()
        for producers in (durable, fast):
            producers.start()
        durable.progress.wait(timeout=120)
        fast.progress.wait(timeout=120)
        scraper.await_scrape()  # the figures before the failover
        old = group.primary
        if kind == "kill":
            timeline.kill(old)
        else:
            demote_by_sentinel(timeline, group)
        timeline.note(f"primary {old.port} {'SIGKILLed' if kind == 'kill' else 'failed over'}"
                      f"; replicas {[r.port for r in group.replicas]}", timeline.killed_at)
        new = group.wait_failover(old.port)
        timeline.note(f"every sentinel names {new.port} the primary")
        for producers in (durable, fast):
            producers.join()
        if kind == "failover":
            wait_until(lambda: demoted(old), timeout=90, interval=0.2,
                       message="the old primary a replica of the new one")
            timeline.note(f"old primary {old.port} a replica in sync")
        release_held(client, sets, found)
        outs = [o for _, o in procs]
        measured = {n: settle(client, p, mirror_db, outs) for n, p in ((1, durable), (0, fast))}
        check_after_settle(client, sets, scraper, found, timeline)
        scraper.__exit__()
        for proc, out in procs:
            assert proc.poll() is None, f"the worker must resume by itself:\n{out.text}"
        note_sentinel_events(timeline, group)
        report(fault_report, "Sentinel primary SIGKILLed under load" if kind == "kill"
               else "SENTINEL FAILOVER under load", timeline,
               [(1, durable, measured[1]), (0, fast, measured[0])])
        for proc, _ in procs:
            proc.terminate()
        for proc, out in procs:
            assert proc.wait(timeout=60) == 0, out.text[-3000:]
        client.close()
    check_promises(measured, found)


def test_a_demoted_primary_answering_readonly_is_dropped_and_reported():
    """A plain URL whose server becomes a replica (a managed service's failover, seen
    before its address moves): the enqueue says so, and the pool's connections to it
    are closed so the next call connects again."""
    with RedisServer() as primary, RedisServer(extra_args=REPLICATION_ARGS) as other:
        client = redis.Redis.from_url(primary.url, decode_responses=True)
        broker = Broker(client, EngineConfig())
        broker.enqueue(QUEUE, count_run.name, ["before"])
        client.execute_command("REPLICAOF", "127.0.0.1", other.port)
        wait_until(lambda: client.info("replication").get("master_link_status") == "up",
                   message="the demotion")
        with pytest.raises(DelayQConnectionError, match="is a replica now"):
            broker.enqueue(QUEUE, count_run.name, ["after"])
        assert broker._pinned is not None
        assert broker._pinned._free == []
        assert all(c._sock is None for c in client.connection_pool._available_connections)


def test_an_enqueue_that_finds_its_job_there_still_writes_for_its_wait_to_cover():
    """A retry after NotReplicated finds the job and adds nothing. It still writes (the
    duplicates counter), so its WAIT waits for the replicas to have everything before
    it, the first try's job included: Redis 7.2+ counts a connection's WAIT from its
    last command that wrote."""
    with RedisServer(extra_args=REPLICATION_ARGS) as primary, RedisServer() as replica:
        client = redis.Redis.from_url(primary.url, decode_responses=True)
        redis.Redis(port=replica.port).execute_command("REPLICAOF", "127.0.0.1", primary.port)
        wait_until(lambda: client.info("replication")["connected_slaves"] == 1,
                   message="the replica")
        broker = Broker(client, EngineConfig())
        broker.enqueue(QUEUE, count_run.name, job_id="twice")
        before = client.info("replication")["master_repl_offset"]
        assert not broker.enqueue(QUEUE, count_run.name, job_id="twice").added
        assert client.info("replication")["master_repl_offset"] > before
        assert client.hget(broker.keys_for(QUEUE, "twice").stats, "du") == "1"
        client.close()


@pytest.mark.parametrize("kind", ["kill", "failover"])
def test_cluster_primary_killed_under_load_and_a_process_started_after_it_connects(
        mirror_db, workers, fault_report, kind):
    """The same on a 3-primary, 3-replica Cluster, both queues in 3 shards: the primary
    killed (or handed over by ``CLUSTER FAILOVER`` sent to its replica) serves a shard
    of each."""
    db = mirror_db
    timeline = Timeline(f"cluster-{kind}")
    try:
        cluster = RedisCluster(replicas=1, node_timeout_ms=1000).start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"could not start a 3-primary, 3-replica local Redis Cluster: {exc}")
    try:
        url = cluster.seeds_url
        queues = {QUEUE: {"shards": 3}, QUEUE_0: {"shards": 3}}
        settings = {"MIN_REPLICAS": 1, "MIN_REPLICAS_TIMEOUT": REPLICA_TIMEOUT,
                    "FAILOVER_RETRY": FAILOVER_RETRY, "QUEUES": queues}
        procs = [workers(url, db, settings) for _ in range(2)]
        for _, out in procs:
            out.wait_for("mirror started", timeout=60)
        client = client_from_url(url, decode_responses=True, socket_timeout=5)
        durable = Producers(Broker(client, engine_config(1, queues=queues)), "c1")
        fast = Producers(Broker(client, engine_config(0, queues=queues)), "c0", queue=QUEUE_0)
        sets, found = {1: durable, 0: fast}, AfterSwitch()
        # A web process of its own: its client is not the producers'.
        scraper = Scraper(Broker(client_from_url(url, decode_responses=True, socket_timeout=5),
                                 engine_config(0))).__enter__()
        # The primary to kill serves a shard of each queue if one does, else of QUEUE.
        tags = {(q, k.shard): k.scheduled for q in (QUEUE, QUEUE_0)
                for k in durable.broker.shards(q)}
        owners = {shard: cluster.primary_port_of(key) for shard, key in tags.items()}
        old_port = max((port for (q, _), port in owners.items() if q == QUEUE),
                       key=lambda port: {q for (q, _), o in owners.items() if o == port} == {
                           QUEUE, QUEUE_0})
        served = {f"{q} shard {i}": key for (q, i), key in tags.items()
                  if owners[(q, i)] == old_port}
        for producers in (durable, fast):
            producers.start()
        durable.progress.wait(timeout=120)
        fast.progress.wait(timeout=120)
        scraper.await_scrape()  # the figures before the failover
        killed = next(n for n in cluster.nodes if n.port == old_port)
        replica_ports = [r.port for r in cluster.replicas_of(old_port)]
        with ClusterWatch(timeline, cluster, old_port, served):
            if kind == "kill":
                timeline.kill(killed)
            else:  # the replica takes over once it has the primary's every write
                timeline.killed_at = time.time()
                with redis.Redis(port=replica_ports[0], socket_timeout=5) as replica:
                    replica.execute_command("CLUSTER FAILOVER")
            how = "SIGKILLed" if kind == "kill" else "failed over"
            timeline.note(f"primary {old_port} {how}, serving {sorted(served)}; its "
                          f"replica {replica_ports}", timeline.killed_at)
            new_port = cluster.wait_failover(next(iter(served.values())), old_port)
            timeline.note(f"port {new_port} serves the slots, cluster_state ok everywhere")
            if kind == "kill":
                killed.start()  # rejoins as a replica of the node that took over
                timeline.note(f"port {old_port} restarted")
            # A process started now, with a dead node first among its seeds, connects.
            seeds = [free_port(), *(p for p in cluster.ports if p != old_port)]
            late_url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in seeds) + "/0"
            late = workers(late_url, db, settings)
            late[1].wait_for("worker started", timeout=60)
            for producers in (durable, fast):
                producers.join()
        release_held(client, sets, found)
        outs = [o for _, o in [*procs, late]]
        measured = {n: settle(client, p, db, outs) for n, p in ((1, durable), (0, fast))}
        check_after_settle(client, sets, scraper, found, timeline)
        scraper.__exit__()
        for proc, out in [*procs, late]:
            assert proc.poll() is None, f"the worker must resume by itself:\n{out.text}"
        report(fault_report, "Cluster primary SIGKILLed under load" if kind == "kill"
               else "CLUSTER FAILOVER under load", timeline,
               [(1, durable, measured[1]), (0, fast, measured[0])],
               lambda p, job_id: p.broker.keys_for(p.queue, job_id).scheduled
               in served.values())
        check_promises(measured, found)
        for proc, _ in [*procs, late]:
            proc.terminate()
        for proc, out in [*procs, late]:
            assert proc.wait(timeout=60) == 0, out.text[-3000:]
        client.close()
    finally:
        cluster.cleanup()
