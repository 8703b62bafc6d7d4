"""A primary SIGKILLed under load: Sentinel and a Cluster with replicas fail over while
producers enqueue and ``runworker`` processes (with their mirror processes) run jobs.

Each run counts what producers were told was enqueued, what Redis still holds after
the failover, what ran, what ran twice, and whether anything started before its
run_at; it adds a row to the fault summary (``fault_report``). With ``MIN_REPLICAS=1``
nothing that returned may be lost; with 0 the loss is measured, not asserted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from django_delayq import DelayQConnectionError, NotReplicated
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.engine.fields import stored
from django_delayq.engine.urls import client_from_url
from django_delayq.testing import (
    REPLICATION_ARGS,
    RedisCluster,
    RedisSentinelGroup,
    RedisServer,
    free_port,
)
from tests.conftest import ROOT, OutputReader, wait_until, worker_env
from tests.test_mirror_faults import sqlite_rows
from tests.testapp.fault_tasks import RUNS, count_run

pytestmark = pytest.mark.slow

#: Jobs per set of producers; the Sentinel run has two sets (5,000 jobs in all).
JOBS = 2_500
QUEUE = "ha"
#: The queue of the producers with MIN_REPLICAS=0, next to them in the same run.
QUEUE_0 = "ha0"
#: Seconds an enqueue keeps retrying through the failover (producers and workers).
FAILOVER_RETRY = 30.0
REPLICA_TIMEOUT = 0.5


@dataclass
class Producers:
    """Two producer threads, one enqueuing jobs one by one, one in chunks of 100, each
    job with an id chosen before its first try; a call that raised is tried again with
    the same ids (safe: an existing id is not added twice)."""

    broker: Broker
    label: str
    queue: str = QUEUE
    jobs: int = JOBS
    #: Ids whose enqueue call returned (the promise made to the caller).
    returned: list[str] = field(default_factory=list)
    #: Ids whose call raised NotReplicated or DelayQConnectionError at least once.
    refused: set[str] = field(default_factory=set)
    errors: list[BaseException] = field(default_factory=list)
    progress: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def request(self, job_id: str, i: int) -> EnqueueRequest:
        # One job in ten is delayed 1-2 s: due ones must never start early.
        delay = 1 + (i % 2) if i % 10 == 0 else None
        return EnqueueRequest(task=count_run.name, args=[job_id], job_id=job_id,
                              max_attempts=1000, delay=delay)

    def start(self) -> None:
        half = self.jobs // 2
        self.threads = [threading.Thread(target=self._guard, args=(self._singles, half)),
                        threading.Thread(target=self._guard,
                                         args=(self._bulk, self.jobs - half))]
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=180)
        assert not any(t.is_alive() for t in self.threads), "a producer hung"
        assert not self.errors, self.errors

    def _guard(self, target: Callable[[int], None], n: int) -> None:
        try:
            target(n)
        except BaseException as exc:
            self.errors.append(exc)

    def _again(self, ids: list[str], send: Callable[[], Any]) -> None:
        for _ in range(100):
            try:
                send()
            except (NotReplicated, DelayQConnectionError):
                self.refused.update(ids)
                continue
            self.returned += ids
            if len(self.returned) >= self.jobs // 4:
                self.progress.set()
            return
        raise AssertionError(f"{ids[0]}: not enqueued after 100 tries")

    def _singles(self, n: int) -> None:
        for i in range(n):
            job_id = f"{self.label}-s{i}"
            request = self.request(job_id, i)
            self._again([job_id], lambda r=request: self.broker.enqueue(
                self.queue, r.task, r.args, job_id=r.job_id, max_attempts=r.max_attempts,
                delay=r.delay))

    def _bulk(self, n: int) -> None:
        for start in range(0, n, 100):
            requests = [self.request(f"{self.label}-b{i}", i)
                        for i in range(start, min(n, start + 100))]
            self._again([r.job_id for r in requests if r.job_id],
                        lambda rs=requests: self.broker.enqueue_many(self.queue, rs))


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory: Any) -> Path:
    """A migrated SQLite database for the mirror, made once and copied by each test."""
    path = tmp_path_factory.mktemp("failover") / "template.sqlite3"
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT,
                   env=worker_env(None, DELAYQ_TEST_SQLITE=str(path)), check=True, timeout=120)
    return path


@pytest.fixture
def mirror_db(migrated_db: Path, tmp_path: Path) -> str:
    path = tmp_path / "mirror.sqlite3"
    shutil.copy(migrated_db, path)
    return str(path)


@pytest.fixture
def workers(spawned: Any) -> Callable[..., tuple[subprocess.Popen[str], OutputReader]]:
    """Start ``runworker`` on both queues with its mirror process writing to ``db``."""

    def start(url: str, db: str, settings: dict[str, Any]) -> tuple[subprocess.Popen[str],
                                                                    OutputReader]:
        return spawned(QUEUE, QUEUE_0, "-c", "4", "--lease", "3", redis_url=url,
                       env={"DELAYQ_TEST_SQLITE": db,
                            "DELAYQ_TEST_SETTINGS": json.dumps(settings)})

    return start


@dataclass
class Measured:
    returned: int
    lost: list[str]
    duplicated: int
    early: list[str]
    mirror_mismatch: dict[str, tuple[str | None, str | None]]


def settle(client: Any, producers: Producers, db: str, out: list[OutputReader]) -> Measured:
    """Wait until every job Redis still holds is completed and the mirror agrees, then
    measure what was lost, run twice or started early."""
    broker, ids, queue = producers.broker, producers.returned, producers.queue
    shards = broker.shards(queue)

    def fields_of(job_ids: list[str]) -> list[list[str | None]]:
        pipe = client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(broker.keys_for(queue, job_id).job(job_id),
                       [stored("status"), stored("run_at"), stored("started_at")])
        return list(pipe.execute())

    def drained() -> bool:
        pending = sum(client.zcard(k.scheduled) + client.zcard(k.ready) + client.zcard(k.active)
                      for k in shards)
        return pending == 0 and all(f[0] in (None, "completed") for f in fields_of(ids))

    logs = lambda: "\n".join(o.text[-2000:] for o in out)  # noqa: E731
    wait_until(drained, timeout=120, interval=0.3, message=f"the queue to drain:\n{logs()}")
    found = dict(zip(ids, fields_of(ids), strict=True))
    lost = [job_id for job_id, f in found.items() if f[0] is None]
    early = [job_id for job_id, (_, run_at, started) in found.items()
             if started is not None and run_at is not None and int(started) < int(run_at)]
    runs = client.hgetall(RUNS)

    def mismatch() -> dict[str, tuple[str | None, str | None]]:
        rows = sqlite_rows(db)
        return {job_id: (f[0], rows.get(job_id)) for job_id, f in found.items()
                if f[0] is not None and rows.get(job_id) != f[0]}

    wait_until(lambda: not mismatch(), timeout=60, interval=0.3,
               message=f"the mirror to equal Redis:\n{logs()}")
    return Measured(len(ids), lost, sum(1 for i in ids if int(runs.get(i, 0)) > 1), early,
                    mismatch())


def engine_config(min_replicas: int, **more: Any) -> EngineConfig:
    return EngineConfig(min_replicas=min_replicas,
                        min_replicas_timeout_ms=int(REPLICA_TIMEOUT * 1000),
                        failover_retry_ms=int(FAILOVER_RETRY * 1000), **more)


def test_sentinel_primary_killed_under_load(mirror_db, workers, fault_report):
    """One SIGKILL, two sets of producers (2,500 jobs each), each on its own queue:
    MIN_REPLICAS=1 (nothing that returned may be lost) and MIN_REPLICAS=0 (the loss is
    counted)."""
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
        for producers in (durable, fast):
            producers.start()
        durable.progress.wait(timeout=120)
        fast.progress.wait(timeout=120)
        old = group.primary
        old.kill()
        group.wait_failover(old.port)
        for producers in (durable, fast):
            producers.join()
        outs = [o for _, o in procs]
        measured = {n: settle(client, p, mirror_db, outs) for n, p in ((1, durable), (0, fast))}
        for proc, out in procs:
            assert proc.poll() is None, f"the worker must resume by itself:\n{out.text}"
        for n, producers in ((1, durable), (0, fast)):
            fault_report(f"Sentinel primary SIGKILLed under load, MIN_REPLICAS={n} "
                         f"({len(producers.refused)} enqueue calls raised, then retried)",
                         measured[n].returned, len(measured[n].lost), measured[n].duplicated)
        for proc, _ in procs:
            proc.terminate()
        for proc, out in procs:
            assert proc.wait(timeout=60) == 0, out.text[-3000:]
        client.close()
    for n in (1, 0):
        assert measured[n].returned == JOBS
        assert measured[n].early == [], "no job may start before its run_at"
        assert measured[n].mirror_mismatch == {}
    assert measured[1].lost == [], "MIN_REPLICAS=1: every enqueue that returned survives"


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
        assert broker._held is not None
        assert broker._held._free == []
        assert all(c._sock is None for c in client.connection_pool._available_connections)


def test_cluster_primary_killed_under_load_and_a_process_started_after_it_connects(
        mirror_db, workers, fault_report):
    db = mirror_db
    try:
        cluster = RedisCluster(replicas=1, node_timeout_ms=1000).start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"could not start a 3-primary, 3-replica local Redis Cluster: {exc}")
    try:
        url = cluster.seeds_url
        settings = {"MIN_REPLICAS": 1, "MIN_REPLICAS_TIMEOUT": REPLICA_TIMEOUT,
                    "FAILOVER_RETRY": FAILOVER_RETRY, "SHARDS": {QUEUE: 3}}
        procs = [workers(url, db, settings) for _ in range(2)]
        for _, out in procs:
            out.wait_for("mirror started", timeout=60)
        client = client_from_url(url, decode_responses=True, socket_timeout=5)
        broker = Broker(client, engine_config(1, shards={QUEUE: 3}))
        tag = broker.shards(QUEUE)[0].scheduled
        producers = Producers(broker, "cluster")
        producers.start()
        producers.progress.wait(timeout=120)
        old_port = cluster.primary_port_of(tag)
        killed = next(n for n in cluster.nodes if n.port == old_port)
        killed.kill()
        cluster.wait_failover(tag, old_port)
        killed.start()  # rejoins as a replica of the node that took over
        # A process started now, with a dead node first among its seeds, connects.
        seeds = [free_port(), *(p for p in cluster.ports if p != old_port)]
        late_url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in seeds) + "/0"
        late = workers(late_url, db, settings)
        late[1].wait_for("worker started", timeout=60)
        producers.join()
        measured = settle(client, producers, db, [o for _, o in [*procs, late]])
        for proc, out in [*procs, late]:
            assert proc.poll() is None, f"the worker must resume by itself:\n{out.text}"
        fault_report(f"Cluster primary SIGKILLed under load, MIN_REPLICAS=1 "
                     f"({len(producers.refused)} enqueue calls raised, then retried)",
                     measured.returned, len(measured.lost), measured.duplicated)
        assert measured.returned == JOBS
        assert measured.lost == []
        assert measured.early == []
        assert measured.mirror_mismatch == {}
        for proc, _ in [*procs, late]:
            proc.terminate()
        for proc, out in [*procs, late]:
            assert proc.wait(timeout=60) == 0, out.text[-3000:]
        client.close()
    finally:
        cluster.cleanup()
