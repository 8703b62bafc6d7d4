"""django-delayq on a real local Redis Cluster (3 primaries): sharded queues, workers in
several processes, limits and pause across shards in different slots."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from django_delayq import DelayQConnectionError, Job, JobSpec, Queue, chain, group
from django_delayq.engine import Broker, EngineConfig, PartialClaimError
from tests.conftest import ran, wait_until, worker_thread
from tests.servers import RedisCluster
from tests.test_flow_control import (
    claim_times,
    claimed_at,
    most_in_any_window,
    start_workers,
    stop_workers,
)
from tests.testapp import tasks
from tests.testapp.keyed_tasks import PEAK, RUNS, per_tenant

pytestmark = pytest.mark.slow

QUEUES = {
    "sharded": {"shards": 4},
    "drain": {"shards": 4},
    "metered": {"shards": 4, "rate_limit": "20/s"},
    "spaced": {"interval": 0.2, "shards": 3},
    "keyed": {"shards": 4},
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    try:
        server = RedisCluster().start()
    except (RuntimeError, OSError) as exc:
        pytest.fail(f"could not start a local Redis Cluster of 3 redis-server processes: "
                    f"{exc}")
    yield server
    server.cleanup()


@contextmanager
def slot_moving(cluster: RedisCluster, client: Any, slot: int) -> Iterator[None]:
    """Hold ``slot`` half-way through a move to another node (MIGRATING on its owner,
    IMPORTING on the target, as ``redis-cli --cluster reshard`` leaves it while it
    copies keys), then finish the move: every key MIGRATEd, the slot the target's on
    every node."""
    source_port = client.nodes_manager.get_node_from_slot(slot).port
    # Primaries only: a replica refuses CLUSTER SETSLOT (it learns the move by gossip).
    primaries = [node.port for node in client.get_primaries()]
    target_port = next(port for port in primaries if port != source_port)
    nodes = {port: redis.Redis(port=port, decode_responses=True) for port in primaries}
    ids = {port: node.execute_command("CLUSTER MYID") for port, node in nodes.items()}
    source, target = nodes[source_port], nodes[target_port]
    try:
        target.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[source_port])
        source.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[target_port])
        yield
        while keys := source.execute_command("CLUSTER GETKEYSINSLOT", slot, 100):
            source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000,
                                   "KEYS", *keys)
        others = [port for port in primaries if port not in (source_port, target_port)]
        for port in [target_port, source_port, *others]:
            nodes[port].execute_command("CLUSTER SETSLOT", slot, "NODE", ids[target_port])
    finally:
        for node in nodes.values():
            node.close()


@pytest.fixture
def on_cluster(settings: Any, cluster: RedisCluster) -> Broker:
    """Settings pointing at the cluster, emptied first; returns the broker."""
    from django_delayq.connection import get_broker

    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": cluster.url, "QUEUES": QUEUES}
    broker = get_broker()
    assert broker.is_cluster
    broker.client.flushall()
    return broker


def test_every_queue_operation_works_on_a_sharded_queue(on_cluster):
    broker = on_cluster
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    bulk = tasks.record.using(queue="sharded").enqueue_many(
        [JobSpec([f"j{i}"], job_id=f"j{i}", priority=i % 3) for i in range(40)]
        + [JobSpec(["later"], job_id="later", run_at=soon)])
    assert bulk.enqueued == 41
    assert len({broker.keys_for("sharded", f"j{i}").tag for i in range(40)}) == 4
    queue = Queue("sharded")
    assert queue.counts()["ready"] == 40
    assert queue.counts()["scheduled"] == 1
    assert queue.next_due() is not None
    assert Job.fetch("j7", "sharded").args == ["j7"]
    assert Job.fetch("j7", "sharded").position() is not None
    assert Job.fetch("j5", "sharded").cancel()
    Job.fetch("later", "sharded").reschedule(delay=7200)
    assert len(queue.jobs("ready", limit=100)) == 39
    assert [j.id for j in queue.jobs("cancelled")] == ["j5"]
    assert Job.fetch("j5", "sharded").retry().status == "ready"
    queue.pause()
    assert sum(len(r.jobs) for r in broker.claim("sharded", 10, "w")) == 0
    queue.resume()
    claimed = broker.claim("sharded", 100, "w")
    assert sum(len(r.jobs) for r in claimed) == 40
    assert queue.counts()["active"] == 40
    assert queue.purge(("scheduled",)) == 1
    assert queue.counts()["scheduled"] == 0


@pytest.mark.django_db
def test_the_mirror_writes_every_shard_and_refresh_rows_reads_each(on_cluster):
    from django_delayq.admin.dashboard import mirror_state
    from django_delayq.engine.backlog import backlogs
    from django_delayq.engine.workers import any_alive
    from django_delayq.mirror import GROUP, Mirror
    from django_delayq.mirror.consumer import refresh_rows
    from django_delayq.models import Job as Row

    broker = on_cluster
    ids = [f"m{i}" for i in range(20)]
    tasks.record.using(queue="sharded").enqueue_many([JobSpec([i], job_id=i) for i in ids])
    entries = sum(broker.client.xlen(keys.events) for keys in broker.shards("sharded"))
    assert backlogs(broker, ["sharded"], GROUP)["sharded"].events == entries > 0
    Mirror(block=0.1, queues=["sharded"]).run(burst=True, timeout=60)
    assert dict(Row.objects.values_list("job_id", "status")) == dict.fromkeys(ids, "ready")
    assert mirror_state(broker, ["sharded"]).lag == 0
    assert not any_alive(broker)  # TIME, then the heartbeats: a cluster pipeline refuses TIME
    cancelled = ids[::5]
    for job_id in cancelled:
        Job.fetch(job_id, "sharded").cancel()
    # One event each, after the group's position: counted on each shard's node.
    assert backlogs(broker, ["sharded"], GROUP)["sharded"].events == len(cancelled)
    assert refresh_rows("sharded", ids) == len(ids)  # one script call per shard
    assert dict(Row.objects.values_list("job_id", "status")) == (
        dict.fromkeys(ids, "ready") | dict.fromkeys(cancelled, "cancelled"))


def test_delayed_jobs_start_on_time_with_markers_watched_per_shard(on_cluster, redis_client):
    jobs = [tasks.count_run.using(queue="sharded", delay=0.3 + i * 0.1).enqueue(f"d{i}")
            for i in range(8)]
    with worker_thread(queues=["sharded"]) as worker:
        assert worker.fetcher.watch is not None, "one watcher per shard marker on a cluster"
        wait_until(lambda: all(j.refresh().status == "completed" for j in jobs),
                   message="delayed jobs on the cluster")
    for job in jobs:
        assert job.started_at >= job.run_at


def test_thousands_of_jobs_drained_by_worker_processes_once_each_in_priority_order(
        on_cluster, cluster):
    n = 3000
    client = on_cluster.client
    tasks.count_run.using(queue="drain").enqueue_many(
        JobSpec([f"t{i}"], job_id=f"t{i}", priority=(i * 7) % 5 - 2) for i in range(n))
    procs = start_workers(3, "drain", {"QUEUES": QUEUES}, redis_url=cluster.url)
    try:
        wait_until(lambda: Queue("drain").counts()["completed"] == n, timeout=90,
                   interval=0.2, message=f"{n} jobs drained")
    finally:
        stop_workers(procs)
    counts = client.hgetall("test:count")
    assert len(counts) == n
    assert set(counts.values()) == {"1"}, "every job ran exactly once"
    by_shard: dict[str, list[tuple[int, int, int]]] = {}
    claims = claim_times("drain")
    for job in Queue("drain").jobs("completed", limit=n):
        index = int(job.id[1:])
        by_shard.setdefault(on_cluster.keys_for("drain", job.id).tag, []).append(
            (-job.priority, index, claims[job.id]))
    assert len(by_shard) == 4
    for jobs in by_shard.values():
        # claim order within a shard: higher priority first, FIFO within a priority
        starts = [started for _, _, started in sorted(jobs)]
        assert starts == sorted(starts)


def test_a_concurrency_key_holds_its_limit_over_shards_and_worker_processes(
        on_cluster, cluster):
    """Each key's jobs live in the shard its key picks: its slots are counted in one
    Cluster slot, whichever shard a worker claims from."""
    client = on_cluster.client
    heavy = [(f"A:{i}", 0.002) for i in range(600)]
    others = [(f"B{i % 30}:{i}", 0.002) for i in range(1200)]
    per_tenant.using(queue="keyed").enqueue_many(heavy + others)
    home = on_cluster.shards("keyed")[zlib.crc32(b"A") % 4]
    assert {on_cluster.keys_for("keyed", job.id) for job in
            Queue("keyed").jobs("ready", limit=2000) if job.args[0].startswith("A:")} == {home}
    slots, stop = [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            slots[0] = max(slots[0], int(float(client.zscore(home.key_active, "A") or 0)))
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    procs = start_workers(3, "keyed", {"QUEUES": QUEUES}, redis_url=cluster.url)
    try:
        wait_until(lambda: client.llen(RUNS) >= 1800, timeout=300, interval=0.2,
                   message="1,800 keyed jobs run")
    finally:
        stop.set()
        sampler.join()
        stop_workers(procs)
    peaks = {key: int(value) for key, value in client.hgetall(PEAK).items()}
    assert client.llen(RUNS) == 1800
    assert peaks["A"] == 2
    assert all(peak <= 2 for key, peak in peaks.items() if key != "*")
    assert peaks["*"] > 2
    assert slots[0] == 2
    assert all(client.zcard(keys.key_active) == 0 for keys in on_cluster.shards("keyed"))


def test_rate_limit_holds_over_all_shards_and_four_worker_processes(on_cluster, cluster,
                                                                     redis_client):
    rate = 20
    client = on_cluster.client
    tasks.record.using(queue="metered").enqueue_many([[f"m{i}"] for i in range(rate * 13)])
    procs = start_workers(4, "metered", {"QUEUES": QUEUES}, redis_url=cluster.url)
    try:
        wait_until(lambda: client.llen("test:ran") >= rate * 11 + 5, timeout=60,
                   interval=0.2, message="eleven seconds of limited jobs")
    finally:
        stop_workers(procs)
    # the tasks noted when they began running (Redis clock): the rate over ten seconds
    starts = sorted(r["redis_ms"] for r in ran(client))
    in_ten_seconds = sum(1 for t in starts if t < starts[0] + 10_000)
    # At most the rate (and the jitter of one second's edge). At least three quarters of
    # it: a limiter far stricter than its rate fails, while a worker a busy machine
    # stalls for a moment, starting a few fewer, does not.
    assert rate * 10 * 0.75 <= in_ten_seconds <= rate * 10 * 1.1, in_ten_seconds
    # the claims (the starts the limiter counts) never exceed the rate in any second
    claims = claimed_at("metered", [j.id for j in Queue("metered").jobs("completed",
                                                                        limit=1000)])
    assert most_in_any_window(claims, 1000) <= rate
    # several processes shared the limit (one slow to start on a busy machine may miss out)
    assert len({r["pid"] for r in ran(client)}) >= 2


def test_sharded_interval_queue_never_starts_two_jobs_closer(on_cluster, cluster):
    assert on_cluster.reserves_starts("spaced")
    jobs = [tasks.record.using(queue="spaced").enqueue(f"s{i}") for i in range(12)]
    procs = start_workers(3, "spaced", {"QUEUES": QUEUES}, redis_url=cluster.url)
    try:
        wait_until(lambda: on_cluster.client.llen("test:ran") == 12, timeout=30)
    finally:
        stop_workers(procs)
    starts = claimed_at("spaced", [j.id for j in jobs])
    assert min(b - a for a, b in itertools.pairwise(starts)) >= 200


def test_one_seed_cluster_url_and_one_worker_on_two_queues(settings, cluster):
    from django_delayq.connection import get_broker

    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": cluster.url}
    broker = get_broker()
    assert broker.is_cluster
    broker.client.flushall()
    first = tasks.count_run.enqueue("a")
    second = tasks.record_other.using(delay=0.5).enqueue("b")
    with worker_thread(queues=["default", "other"]) as worker:
        assert worker.fetcher.watch is not None, "two hash tags: a watcher each"
        wait_until(lambda: second.refresh().status == "completed", message="both queues")
    assert first.refresh().status == "completed"
    assert second.started_at >= second.run_at


def test_single_enqueues_on_a_cluster_keep_the_client_path(on_cluster):
    broker = on_cluster
    assert broker._pinned is None  # a cluster client routes each call by its keys' slot
    jobs = [tasks.record.using(queue="sharded").enqueue(f"c{i}") for i in range(20)]
    assert all(job.created for job in jobs)
    assert {Job.fetch(job.id, queue="sharded").status for job in jobs} == {"ready"}


def test_a_claim_keeps_what_the_other_shards_leased_while_one_slot_moves(on_cluster, cluster):
    broker = on_cluster
    tasks.record.using(queue="sharded").enqueue_many(
        [JobSpec([f"p{i}"], job_id=f"p{i}") for i in range(40)])
    shards = broker.shards("sharded")
    moving = shards[0]
    on_moving = {f"p{i}" for i in range(40) if broker.keys_for("sharded", f"p{i}") == moving}
    assert 0 < len(on_moving) < 40
    # The moving shard answers TRYAGAIN (its keys are split between two nodes); the jobs
    # the other shards leased in the same round trip are handed over anyway.
    with (slot_moving(cluster, broker.client, broker.client.keyslot(moving.ready)),
          pytest.raises(PartialClaimError) as caught):
        broker.claim("sharded", 100, "w")
    assert caught.value.failed == 1
    assert {r.keys for r in caught.value.results} == set(shards[1:])
    leased = {job.id for r in caught.value.results for job in r.jobs}
    assert leased == {f"p{i}" for i in range(40)} - on_moving
    # Once the slot has moved, its jobs are claimed from the node that now holds them.
    claimed = broker.claim("sharded", 100, "w")
    assert {job.id for r in claimed for job in r.jobs} == on_moving
    assert Queue("sharded").counts()["active"] == 40


def test_a_focused_claim_on_a_moving_slot_claims_from_the_other_shards_at_once(
        on_cluster, cluster, monkeypatch):
    from django_delayq.runtime.worker import fetcher as fetcher_module
    from django_delayq.worker import Worker

    monkeypatch.setattr(fetcher_module, "QUIET_SHARD_INTERVAL", 3600.0)
    broker = on_cluster
    every = {f"f{i}" for i in range(200)}
    tasks.record.using(queue="sharded").enqueue_many(JobSpec([i], job_id=i) for i in every)
    moving = broker.shards("sharded")[0]
    on_moving = {i for i in every if broker.keys_for("sharded", i) == moving}
    fetcher = Worker(["sharded"], broker=broker, concurrency=2, prefetch=6,
                     burst=True).fetcher
    # A full round: every shard gave all it was asked (2), so each has a backlog and
    # focused rounds take them in turn, the moving one among them.
    assert fetcher.claim(8)[0] == 8

    def held() -> set[str]:
        return {job.id for job in fetcher.ledger.held()}

    with slot_moving(cluster, broker.client, broker.client.keyslot(moving.ready)):
        for _ in range(4):
            # The moving shard's TRYAGAIN costs no claim round: a full round follows at
            # once, takes the other shards' jobs and leaves the moving one out.
            assert fetcher.claim(8)[0] > 0
        while fetcher.claim(8)[0]:
            pass
        assert every - on_moving <= held()
        assert len(held() & on_moving) == 2, "only the first round's jobs of the moving shard"
    # Moved: the shard is asked again once its SHARD_BACKOFF is over.
    wait_until(lambda: fetcher.claim(8) and held() == every, message="the moved shard's jobs")
    assert Queue("sharded").counts()["active"] == len(every)


def test_a_worker_runs_the_other_shards_while_one_slot_moves_and_loses_nothing(
        on_cluster, cluster):
    n = 1200
    client = on_cluster.client
    tasks.count_run.using(queue="drain").enqueue_many(
        JobSpec([f"m{i}"], job_id=f"m{i}") for i in range(n))
    moving = on_cluster.shards("drain")[0]
    every = {f"m{i}" for i in range(n)}
    on_moving = {job_id for job_id in every if on_cluster.keys_for("drain", job_id) == moving}
    procs = []
    try:
        with slot_moving(cluster, client, client.keyslot(moving.ready)):
            procs = start_workers(1, "drain", {"QUEUES": QUEUES}, redis_url=cluster.url)
            procs[0][1].wait_for("worker started", timeout=120)  # a busy machine: slow
            # Well within the 30 s lease from the worker's start: a claim whose answers
            # were dropped for the one refusing shard would leave these jobs leased and
            # idle until it lapsed.
            wait_until(lambda: client.hlen("test:count") >= n - len(on_moving), timeout=20,
                       interval=0.1, message="the jobs of the shards that are not moving")
            assert set(client.hkeys("test:count")) == every - on_moving
        wait_until(lambda: Queue("drain").counts()["completed"] == n, timeout=60,
                   interval=0.1, message="every job, the moved shard's included")
    finally:
        stop_workers(procs)
    assert set(client.hvals("test:count")) == {"1"}, "every job ran exactly once"
    assert Queue("drain").counts()["active"] == 0


def test_acks_to_the_other_shards_land_while_one_slot_moves(on_cluster, cluster):
    from django_delayq.runtime.worker.acks import send_outcomes
    from django_delayq.worker import Outcome

    broker = on_cluster
    tasks.record.using(queue="sharded").enqueue_many(
        [JobSpec([f"a{i}"], job_id=f"a{i}") for i in range(40)])
    jobs = [job for r in broker.claim("sharded", 100, "w") for job in r.jobs]
    assert len(jobs) == 40
    moving = broker.shards("sharded")[0]
    outcomes = [Outcome(job, True, result_json="null") for job in jobs]
    with slot_moving(cluster, broker.client, broker.client.keyslot(moving.ready)):
        sent = send_outcomes(broker, outcomes)
    # Only the refused shard's acks are left to send again; the others landed once.
    assert {o.job.id for o in sent.unsent} == {job.id for job in jobs if job.keys == moving}
    assert sent.error is not None
    assert sent.stale == 0
    assert Queue("sharded").counts()["completed"] == 40 - len(sent.unsent)
    again = send_outcomes(broker, sent.unsent)
    assert (again.unsent, again.stale) == ([], 0)
    assert Queue("sharded").counts()["completed"] == 40


def test_a_worker_keeps_acking_the_other_shards_while_one_slot_moves(on_cluster, cluster):
    from django_delayq.worker import Outcome, Worker

    broker = on_cluster
    tasks.record.using(queue="sharded").enqueue_many(
        [JobSpec([f"k{i}"], job_id=f"k{i}") for i in range(40)])
    jobs = [job for r in broker.claim("sharded", 100, "w") for job in r.jobs]
    moving = broker.shards("sharded")[0]
    on_moving = [job for job in jobs if job.keys == moving]
    first, later = jobs[:20], jobs[20:]
    assert any(job.keys == moving for job in first)
    worker = Worker(["sharded"], broker=broker)
    worker.acker.outcomes = [Outcome(job, True, result_json="null") for job in first]
    with slot_moving(cluster, broker.client, broker.client.keyslot(moving.ready)):
        # Some shards took their acks: no error for the acker's backoff, which would hold
        # back every shard's next acks too.
        worker.acker.flush()
        assert worker.processed == sum(job.keys != moving for job in first)
        # The refusing shard's acks wait out its pause; the others' go at once.
        worker.acker.outcomes += [Outcome(job, True, result_json="null") for job in later]
        worker.acker.flush()
        assert worker.processed == 40 - len(on_moving)
        assert {o.job.id for o in worker.acker.outcomes} == {job.id for job in on_moving}
        worker.acker.flush()  # only deferred acks are pending: nothing is sent
        assert Queue("sharded").counts()["completed"] == 40 - len(on_moving)
    # Slot moved. At shutdown the deferred acks are sent, backoff or not.
    worker.acker.flush_until_done(time.monotonic() + 5)
    assert (worker.processed, worker.acker.outcomes) == (40, [])
    assert Queue("sharded").counts()["completed"] == 40


def test_enqueues_to_a_moving_slot_raise_a_clear_error_and_bulk_counts_what_landed(
        on_cluster, cluster):
    from django_delayq.engine import BulkResult, EnqueueRequest

    broker = on_cluster
    moving = broker.shards("sharded")[0]
    ids = [f"e{i}" for i in range(40)]
    on_moving = {job_id for job_id in ids if broker.keys_for("sharded", job_id) == moving}
    total = BulkResult()
    with slot_moving(cluster, broker.client, broker.client.keyslot(moving.ready)):
        with pytest.raises(DelayQConnectionError, match="TRYAGAIN"):
            tasks.record.using(queue="sharded", job_id=min(on_moving)).enqueue("x")
        with pytest.raises(DelayQConnectionError):
            broker.enqueue_many("sharded", [EnqueueRequest(task="tests.testapp.tasks.record",
                                                           job_id=job_id) for job_id in ids],
                                total=total)
    # The other shards' jobs were added, and the totals say so; the moving shard's not.
    assert set(total.job_ids) == set(ids) - on_moving
    assert total.enqueued == len(ids) - len(on_moving)
    assert Queue("sharded").counts()["ready"] == total.enqueued
    # Sent again once the slot has moved, the call adds exactly the missing jobs.
    again = broker.enqueue_many("sharded", [EnqueueRequest(task="tests.testapp.tasks.record",
                                                           job_id=job_id) for job_id in ids])
    assert (again.enqueued, again.duplicates) == (len(on_moving), len(ids) - len(on_moving))


def test_failover_retry_sends_again_the_shard_a_bulk_chunk_could_not_reach(
        on_cluster, cluster):
    """FAILOVER_RETRY covers a shard whose reply inside the bulk pipeline is an error (its
    slot moving: TRYAGAIN): the other shards' jobs count once, that shard's are sent
    again until the move ends, and the call returns."""
    from django_delayq.engine import BulkResult, EngineConfig, EnqueueRequest

    broker = Broker(on_cluster.client, EngineConfig(queues={"sharded": {"shards": 4}},
                                                    failover_retry_ms=60_000))
    moving = broker.shards("sharded")[0]
    ids = [f"r{i}" for i in range(40)]
    on_moving = {job_id for job_id in ids if broker.keys_for("sharded", job_id) == moving}
    assert 0 < len(on_moving) < len(ids)
    tasks.record.using(queue="sharded", job_id=min(on_moving)).enqueue("there first")
    total, errors = BulkResult(), []

    def send() -> None:
        try:
            broker.enqueue_many("sharded", [EnqueueRequest(task=tasks.record.name, job_id=j)
                                            for j in ids], total=total)
        except BaseException as exc:
            errors.append(exc)

    with slot_moving(cluster, broker.client, broker.client.keyslot(moving.ready)):
        sender = threading.Thread(target=send)
        sender.start()
        # The other shards answered; the moving one is being retried.
        wait_until(lambda: Queue("sharded").counts()["ready"] == len(ids) - len(on_moving) + 1
                   or errors, message="the other shards' jobs")
        assert sender.is_alive(), errors
    sender.join(timeout=60)
    assert not sender.is_alive()
    assert errors == []
    assert (total.enqueued, total.duplicates) == (len(ids) - 1, 1)
    assert total.job_ids == ids, "in call order, whatever shard answered first"
    assert Queue("sharded").counts()["ready"] == len(ids)


def test_a_dependant_is_linked_once_its_parent_s_shard_answered_a_failover_retry(
        on_cluster, cluster, caplog):
    """A parent and its dependant in one bulk chunk, on two shards: the parent's shard
    is retried (its slot moving) after the dependant's answered. The dependant is linked
    only once the parent is stored, so it waits for it instead of finding it missing."""
    from django_delayq.engine import EngineConfig, EnqueueRequest

    broker = Broker(on_cluster.client, EngineConfig(queues={"sharded": {"shards": 4}},
                                                    failover_retry_ms=60_000))
    moving = broker.shards("sharded")[0]
    ids = (f"d{i}" for i in itertools.count())
    parent_id = next(i for i in ids if broker.keys_for("sharded", i) == moving)
    child_id = next(i for i in ids if broker.keys_for("sharded", i) != moving)
    there_first = next(i for i in ids if broker.keys_for("sharded", i) == moving)
    tasks.record.using(queue="sharded", job_id=there_first).enqueue("there first")
    errors: list[BaseException] = []

    def send() -> None:
        try:
            broker.enqueue_many("sharded", [
                EnqueueRequest(task=tasks.record.name, args=["p"], job_id=parent_id),
                EnqueueRequest(task=tasks.record.name, args=["c"], job_id=child_id,
                               depends_on=[parent_id])])
        except BaseException as exc:
            errors.append(exc)

    caplog.set_level("DEBUG", logger="django_delayq.engine.failover")
    with slot_moving(cluster, broker.client, broker.client.keyslot(moving.ready)):
        sender = threading.Thread(target=send)
        sender.start()
        # redis-py gave up on the moving slot: the chunk's other shard has answered
        wait_until(lambda: errors or any("retrying the enqueue" in r.getMessage()
                                         for r in caplog.records),
                   message="a failover retry of the parent's shard")
        assert broker.client.exists(broker.keys_for("sharded", child_id).job(child_id))
        assert sender.is_alive(), errors
    sender.join(timeout=60)
    assert not sender.is_alive()
    assert errors == []
    child = Job.fetch(child_id, "sharded", broker=broker)
    assert child.status == "waiting", child.error
    with worker_thread(queues=["sharded"], broker=broker):
        wait_until(lambda: child.refresh().status == "completed",
                   message="the dependant to run after its parent")


def test_a_url_naming_several_seeds_connects_while_the_first_is_down(settings, cluster):
    """A process starting while the node its URL names first is down (a restarted
    worker, a deploy) reaches the cluster through the next seed."""
    from django_delayq.connection import get_broker
    from django_delayq.testing import free_port

    dead = free_port()  # nothing listens there
    seeds = ",".join(f"127.0.0.1:{port}" for port in [dead, *cluster.ports])
    settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": f"redis+cluster://{seeds}/0",
                       "QUEUES": QUEUES}
    broker = get_broker()
    assert broker.is_cluster
    job = tasks.record.using(queue="sharded").enqueue("through the second seed")
    assert Job.fetch(job.id, "sharded").args == ["through the second seed"]
    assert {node.port for node in broker.client.get_primaries()} == set(cluster.ports)


def test_workflows_release_across_cluster_slots_exactly_once(on_cluster, cluster, spawned):
    """A group whose members sit in 4 shards (4 slots) and whose callback is in another
    queue, and a chain hopping between queues: every release crosses slots."""
    n = 200
    members = [tasks.count_run.using(queue="drain").bind(f"m{i}") for i in range(n)]
    jobs = group(members).then(tasks.flow_collect.bind("cb")).enqueue()
    steps = chain(tasks.flow_step.bind(0), tasks.flow_step.using(queue="sharded").bind(),
                  tasks.flow_step.bind(), pass_results=True).enqueue()
    assert {on_cluster.keys_for("drain", j.id).tag for j in jobs.members} == {
        k.tag for k in on_cluster.shards("drain")}
    env = {"DELAYQ_TEST_SETTINGS": json.dumps({"QUEUES": QUEUES})}
    for _ in range(2):
        spawned("drain", "sharded", "default", "-c", "4", redis_url=cluster.url, env=env)
    wait_until(lambda: Job.fetch(jobs.callback.id).status == "completed"
               and Job.fetch(steps[-1].id).status == "completed", timeout=60,
               message="the callback and the chain's last step ran")
    client = on_cluster.client
    assert set(client.hgetall("test:count").values()) == {"1"}
    collected = [x for x in ran(client) if x["task"] == "flow_collect"]
    assert [(c["n"], c["nones"]) for c in collected] == [(n, n)]  # once, every result
    assert Job.fetch(steps[-1].id).result == 3


def test_scripts_load_on_the_nodes_that_answer_while_one_is_down():
    """A node that is down must not keep the others from a script: they are loaded one
    by one, and only when no node takes it does the load raise."""
    from django_delayq.engine.failover import UNAVAILABLE
    from django_delayq.engine.scripts import load_everywhere, load_script
    from django_delayq.engine.urls import client_from_url

    sha = load_script("enqueue").sha
    with RedisCluster() as own:
        client = client_from_url(own.url, decode_responses=True)
        try:
            client.exists("any key")  # the client learns the nodes
            *up, down = own.nodes
            down.stop()
            load_everywhere(client, "enqueue")
            for node in up:
                with redis.Redis(port=node.port) as direct:
                    assert direct.script_exists(sha) == [True], node.port
            for node in up:
                node.stop()
            with pytest.raises(UNAVAILABLE):
                load_everywhere(client, "enqueue")
        finally:
            client.close()


def test_a_marker_watcher_outlives_the_whole_cluster_going_away(caplog):
    """redis-py raises RedisClusterException, not a RedisError, when no node of the
    cluster answers: the watcher logs it and keeps watching, so idle workers still wake
    up on a mark once the cluster is back."""
    from django_delayq.engine.urls import client_from_url
    from django_delayq.runtime.worker.markers import MarkerWatch

    marker = "{t:watched}:marker"
    with RedisCluster() as own:
        client = client_from_url(own.url, decode_responses=True)
        stop = threading.Event()
        watch = MarkerWatch(Broker(client, EngineConfig()), [marker], stop)
        try:
            for node in own.nodes:
                node.stop()
            with caplog.at_level("WARNING", logger="django_delayq.worker"):
                # the watcher's calls fail while the worker idles
                wait_until(lambda: watch.wait(0.5) or any(
                    "marker watch failed" in r.getMessage() for r in caplog.records),
                    message="the watcher's warning")
            for node in own.nodes:
                node.start()

            def marked() -> bool:
                try:
                    client.zadd(marker, {"0": 0})
                except (redis.RedisError, redis.exceptions.RedisClusterException):
                    return False
                return True

            wait_until(marked, timeout=30, message="the cluster back")
            watch.wait(60.0)  # returns once the watcher pops the mark
            assert client.zcard(marker) == 0, "the watcher is gone: nothing popped the mark"
        finally:
            stop.set()
            client.close()


def test_an_idle_worker_claims_again_after_the_whole_cluster_was_away(settings, caplog):
    """One unsharded queue on a cluster: the idle fetcher blocks on its marker itself
    (one slot). While no node answers, redis-py raises RedisClusterException (not a
    RedisError): the fetcher and the heartbeat wait it out, and the worker claims and
    beats again once the cluster is back."""
    with RedisCluster() as own, caplog.at_level("WARNING", logger="django_delayq.worker"):
        settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": own.url}
        with worker_thread(queues=["default"], block_timeout=0.5, lease=1.5) as worker:
            assert worker.fetcher.watch is None, "one marker: no watcher threads"
            first = tasks.record.enqueue("before")
            wait_until(lambda: first.refresh().status == "completed", message="a first job")
            for node in own.nodes:
                node.stop()
            # The fetcher meets it idle (blocked on the marker) or, on a busy machine,
            # still in its claim's retries: either record says it.
            wait_until(lambda: all(any(r.getMessage().startswith(event) for r in caplog.records)
                                   for event in ("redis unavailable", "heartbeat failed")),
                       message="the fetcher and the heartbeat to meet the outage")
            with pytest.raises(DelayQConnectionError, match="Redis Cluster"):
                tasks.record.enqueue("while no node answers")
            for node in own.nodes:
                node.start()

            def enqueued() -> Any:
                try:
                    return tasks.record.enqueue("after")
                except DelayQConnectionError:
                    return None

            second = wait_until(enqueued, timeout=30, message="the cluster back")
            wait_until(lambda: second.refresh().status == "completed", timeout=30,
                       message="a job enqueued once the cluster is back")
            record = worker.broker.global_keys.worker(worker.name)
            worker.broker.client.delete(record)
            wait_until(lambda: worker.broker.client.exists(record), message="a heartbeat")
