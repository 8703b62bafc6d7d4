"""Faults in real processes: workers killed and frozen, Redis restarted and unreachable.

Every test counts what it enqueued, what ran (``tests.testapp.fault_tasks`` notes each
run in Redis) and what was lost, and adds a row to the fault summary printed at the end
of the run (see ``fault_report`` in conftest.py).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from typing import Any

import pytest
import redis

from django_delayq.connection import get_broker
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest, QueueKeys
from django_delayq.engine.fields import stored
from django_delayq.testing import RedisServer
from tests.conftest import child_pids, kill_with_children, wait_until, worker_pids
from tests.testapp.fault_tasks import RUNS, count_run

CHAOS_JOBS = 20_000
CHAOS_WORKERS = 3
CONCURRENCY = 4
PREFETCH = 4
LEASE = "2"
#: What a worker logs when it finds Redis gone: its fetcher when it claims, else (every
#: slot taken by jobs whose acks wait) its acker or its heartbeat.
OUTAGE_NOTICED = ("redis unavailable", "acks not sent", "heartbeat failed")


def client_for(url: str) -> Any:
    return redis.Redis.from_url(url, decode_responses=True)


def statuses(client: Any, keys: QueueKeys, job_ids: list[str]) -> list[str | None]:
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hget(keys.job(job_id), stored("status"))
    return list(pipe.execute())


def run_counts(client: Any, job_ids: list[str]) -> list[int]:
    runs = client.hgetall(RUNS)
    return [int(runs.get(job_id, 0)) for job_id in job_ids]


def held_by(client: Any, keys: QueueKeys, worker: str) -> list[str]:
    """Ids leased (claimed, not acked) by ``worker``."""
    active = client.zrange(keys.active, 0, -1)
    pipe = client.pipeline(transaction=False)
    for job_id in active:
        pipe.hget(keys.job(job_id), stored("worker"))
    return [job_id for job_id, w in zip(active, pipe.execute(), strict=True) if w == worker]


def registered(client: Any, worker: str) -> bool:
    """Whether ``worker`` runs (it has signal handlers once it records itself alive)."""
    return client.zscore(get_broker().global_keys.workers, worker) is not None


#: The workers keep every finished job's record, so the end state of each one is read
#: (KEEP_COMPLETED trims the records past it, 10,000 by default).
KEEP_EVERY_RECORD = {"DELAYQ_TEST_SETTINGS": json.dumps({"KEEP_COMPLETED": 10 * CHAOS_JOBS})}


def chaos_requests(n: int) -> list[EnqueueRequest]:
    """``n`` jobs, one in ten delayed 1-4 s so promotion happens under the kills too."""
    return [
        EnqueueRequest(task=count_run.name, args=[f"c{i}"], job_id=f"c{i}", max_attempts=1000,
                       delay=1 + (i % 4) if i % 10 == 0 else None)
        for i in range(n)
    ]


@pytest.mark.slow
def test_chaos_soak_sigkill_a_worker_every_second_loses_nothing(redis_client, spawned,
                                                                 fault_report):
    broker = get_broker()
    keys = broker.shards("chaos")[0]
    job_ids = broker.enqueue_many("chaos", chaos_requests(CHAOS_JOBS)).job_ids
    assert len(job_ids) == CHAOS_JOBS

    serial = iter(range(10_000))

    def start() -> tuple[Any, str]:
        name = f"chaos-{next(serial)}"
        proc, _ = spawned("chaos", "-c", str(CONCURRENCY), "--prefetch", str(PREFETCH),
                          "--lease", LEASE, "--name", name, "-v", "0", env=KEEP_EVERY_RECORD)
        return proc, f"{name}-0"  # its one worker process's name

    slots = [start() for _ in range(CHAOS_WORKERS)]
    rng = random.Random(5)
    in_flight: list[set[str]] = []
    # The jobs whose lease lapsed and was reclaimed (read as the soak goes, before the
    # capped stream drops them): a killed worker's, or a live one's held past its 2 s
    # lease on a busy machine.
    reclaimed: set[str] = set()
    read_from = "0"

    def read_reclaims() -> None:
        nonlocal read_from
        while batch := redis_client.xread({keys.events: read_from}, count=10_000):
            for entry_id, fields in batch[0][1]:
                read_from = entry_id
                if fields.get("event") == "reclaimed":
                    reclaimed.add(fields["job"])
    # Generous: a loaded machine slows the run down, and each kill costs a restart.
    deadline = time.monotonic() + 240

    def finished() -> bool:
        counts = broker.client.pipeline(transaction=False)
        for key in (keys.scheduled, keys.ready, keys.active):
            counts.zcard(key)
        return redis_client.hlen(RUNS) == CHAOS_JOBS and not any(counts.execute())

    while not finished():
        assert time.monotonic() < deadline, (
            f"soak did not finish: {redis_client.hlen(RUNS)} of {CHAOS_JOBS} ran")
        # The fault schedule: one SIGKILL a second, to a worker picked at random.
        time.sleep(1.0)
        slot = rng.randrange(CHAOS_WORKERS)
        proc, name = slots[slot]
        # Frozen, it changes nothing: what it holds now is what it can run twice. The
        # machine dies: runworker and its worker process at once.
        (worker,) = wait_until(lambda proc=proc: child_pids(proc.pid),
                               message="its worker process")
        os.kill(worker, signal.SIGSTOP)
        in_flight.append(set(held_by(redis_client, keys, name)))
        kill_with_children(proc)
        slots[slot] = start()
        read_reclaims()

    for proc, name in slots:
        wait_until(lambda name=name: registered(redis_client, name), message=f"{name} up")
        proc.send_signal(signal.SIGTERM)
    for proc, _ in slots:
        assert proc.wait(timeout=60) == 0

    read_reclaims()
    final = statuses(redis_client, keys, job_ids)
    counts = run_counts(redis_client, job_ids)
    lost = [j for j, s, c in zip(job_ids, final, counts, strict=True)
            if s != "completed" or c < 1]
    duplicated = [j for j, c in zip(job_ids, counts, strict=True) if c > 1]
    kills = len(in_flight)
    held_at_kills = set().union(*in_flight) if in_flight else set()
    outside_kills = set(duplicated) - held_at_kills
    fault_report(f"SIGKILL a worker every 1 s ({kills} kills, {CHAOS_WORKERS} workers)",
                 CHAOS_JOBS, len(lost), len(duplicated))
    print(f"chaos: kills={kills} in_flight_at_kills={sum(map(len, in_flight))} "
          f"duplicates={len(duplicated)} outside_kills={len(outside_kills)} "
          f"reclaimed={len(reclaimed)}")
    assert not lost, f"{len(lost)} jobs lost, e.g. {lost[:5]}"
    assert kills >= 3, "the soak should have killed workers"
    # Only a job whose lease lapsed can run twice: one a killed worker held (it holds no
    # more than its room), or, on a busy machine, one a live worker held past its lease.
    assert not outside_kills - reclaimed, (
        f"ran twice, its lease never lapsed: {sorted(outside_kills - reclaimed)[:5]}")
    assert max(map(len, in_flight)) <= CONCURRENCY + PREFETCH


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.slow
def test_redis_crash_with_aof_keeps_jobs_and_workers_reconnect(spawned, fault_report):
    with RedisServer(appendonly=True) as server:
        client = client_for(server.url)
        broker = Broker(client, EngineConfig())
        keys = broker.shards("chaos")[0]
        workers = [spawned("chaos", "-c", "4", "--lease", "2", redis_url=server.url)
                   for _ in range(2)]
        for _, out in workers:
            out.wait_for("worker started")
        ready = [EnqueueRequest(task=count_run.name, args=[f"r{i}"], job_id=f"r{i}",
                                max_attempts=10) for i in range(3_000)]
        delayed = [EnqueueRequest(task=count_run.name, args=[f"d{i}"], job_id=f"d{i}",
                                  max_attempts=10, delay=2.5) for i in range(1_000)]
        early = broker.enqueue_many("chaos", ready + delayed).job_ids
        enqueued_ms = server_ms(client)
        # AOF with appendfsync everysec promises what was written over a second ago.
        wait_until(lambda: server_ms(client) - enqueued_ms > 1_100, message="a second")
        late = broker.enqueue_many("chaos", [
            EnqueueRequest(task=count_run.name, args=[f"l{i}"], job_id=f"l{i}",
                           max_attempts=10) for i in range(500)]).job_ids
        assert client.zcard(keys.scheduled) > 0, "the delayed jobs must outlive the crash"
        done_at_crash = statuses(client, keys, early).count("completed")
        server.kill()
        for _, out in workers:
            out.wait_for(*OUTAGE_NOTICED, timeout=30)
        server.start()
        wait_until(lambda: statuses(client, keys, early).count("completed") == len(early),
                   timeout=60, message="every job enqueued before the crash to complete")
        survived = [s for s in statuses(client, keys, late) if s is not None]
        wait_until(lambda: all(s == "completed" for s in statuses(client, keys, late)
                               if s is not None), message="surviving late jobs to complete")
        for proc, out in workers:
            assert proc.poll() is None, f"the worker must reconnect by itself:\n{out.text}"
        counts = run_counts(client, early)
        lost = sum(1 for c in counts if c < 1)
        fault_report("Redis SIGKILLed and restarted (AOF everysec)", len(early), lost,
                     sum(1 for c in counts if c > 1))
        print(f"restart: completed before the crash {done_at_crash}/{len(early)}, "
              f"late jobs (under a second old) surviving: {len(survived)}/{len(late)}")
        assert lost == 0
        for proc, _ in workers:
            proc.send_signal(signal.SIGTERM)
        for proc, out in workers:
            assert proc.wait(timeout=30) == 0, out.text


@pytest.mark.slow
def test_redis_restart_without_persistence_loses_the_queue_but_not_the_worker(spawned,
                                                                             fault_report):
    with RedisServer() as server:
        client = client_for(server.url)
        broker = Broker(client, EngineConfig())
        keys = broker.shards("chaos")[0]
        proc, out = spawned("chaos", "-c", "4", "--lease", "2", redis_url=server.url)
        out.wait_for("worker started")
        before = broker.enqueue_many("chaos", [
            EnqueueRequest(task=count_run.name, args=[f"v{i}"], job_id=f"v{i}")
            for i in range(5_000)]).job_ids
        wait_until(lambda: client.hlen(RUNS) > 100, message="the run to be under way")
        ran = client.hlen(RUNS)
        server.kill()
        out.wait_for(*OUTAGE_NOTICED, timeout=30)
        server.start()  # empty: no AOF, no RDB
        # No job is left (the reconnecting worker may have re-registered itself, and a task
        # that was running may have counted its run on the new server already).
        assert list(client.scan_iter(match=keys.job_prefix + "*")) == []
        after = broker.enqueue_many("chaos", [
            EnqueueRequest(task=count_run.name, args=[f"w{i}"], job_id=f"w{i}")
            for i in range(200)]).job_ids
        wait_until(lambda: statuses(client, keys, after).count("completed") == len(after),
                   timeout=30, message=f"jobs after the restart:\n{out.text[-3000:]}")
        assert proc.poll() is None, "acks of jobs that vanished must not stop the worker"
        assert statuses(client, keys, before).count(None) == len(before), (
            "without persistence the queue is gone: use AOF")
        # Jobs that had not run by the crash (about: a few more may have run since).
        fault_report("Redis restarted WITHOUT persistence (loss expected)", len(before),
                     len(before) - ran, 0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, out.text[-3000:]


def test_worker_backs_off_while_redis_is_down_then_resumes(spawned, fault_report):
    server = RedisServer()
    try:
        proc, out = spawned("chaos", "-c", "2", redis_url=server.url)
        out.wait_for("worker started")
        out.wait_for("redis unavailable retry_in_s=0.8 ")
        assert proc.poll() is None, "the worker must wait for Redis, not exit"
        server.start()
        broker = Broker(client_for(server.url), EngineConfig())
        job_ids = broker.enqueue_many("chaos", [
            EnqueueRequest(task=count_run.name, args=[f"u{i}"], job_id=f"u{i}")
            for i in range(50)]).job_ids
        keys = broker.shards("chaos")[0]
        wait_until(lambda: statuses(broker.client, keys, job_ids).count("completed") == 50,
                   timeout=30, message=f"jobs after Redis came up:\n{out.text}")
        delays = [float(line.split(" retry_in_s=")[1].split()[0])
                  for line in out.lines if "redis unavailable retry_in_s=" in line]
        assert delays[:4] == [0.1, 0.2, 0.4, 0.8]
        assert delays == sorted(delays), "the pause between retries only grows"
        assert max(delays) <= 5.0
        assert proc.poll() is None
        fault_report("Redis unreachable at worker start", 50, 50 - run_counts(
            broker.client, job_ids).count(1), 0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, out.text
    finally:
        server.cleanup()


@pytest.mark.slow
def test_worker_does_not_hang_on_a_server_that_stops_answering(spawned, fault_report):
    with RedisServer() as server:
        proc, out = spawned("chaos", "-c", "2", redis_url=server.url)
        out.wait_for("worker started")
        broker = Broker(client_for(server.url), EngineConfig())
        keys = broker.shards("chaos")[0]
        first = broker.enqueue("chaos", count_run.name, ["before"], job_id="before").job_id
        wait_until(lambda: statuses(broker.client, keys, [first]) == ["completed"],
                   message="a job before the freeze")
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)  # accepts connections, answers nothing
        try:
            out.wait_for("redis unavailable", timeout=30)
            assert proc.poll() is None
        finally:
            server.process.send_signal(signal.SIGCONT)
        second = broker.enqueue("chaos", count_run.name, ["after"], job_id="after").job_id
        wait_until(lambda: statuses(broker.client, keys, [second]) == ["completed"],
                   timeout=30, message=f"a job after the thaw:\n{out.text}")
        fault_report("Redis frozen (SIGSTOP) under an idle worker", 2,
                     2 - run_counts(broker.client, [first, second]).count(1), 0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, out.text


def stale_acks(lines: list[str]) -> int:
    return sum(int(line.split(" acks=")[1].split()[0])
               for line in lines if "acks were stale" in line)



def events_of(client: Any, keys: QueueKeys, job_id: str) -> list[str]:
    """The events that name ``job_id``, oldest first (an entry may name several jobs)."""
    return [fields["event"] for _, fields in client.xrange(keys.events)
            if job_id in (fields.get("jobs") or fields.get("job", "")).split(" ")]


def test_frozen_worker_late_ack_and_failure_do_not_overwrite_the_newer_run(
        redis_client, spawned, fault_report):
    from tests.testapp.fault_tasks import fenced

    keys = get_broker().shards("default")[0]
    jobs = [fenced.enqueue("j1"), fenced.enqueue("j2")]
    frozen_host, frozen_out = spawned("default", "-c", "2", "--lease", "1", "--name",
                                      "frozen")
    (frozen,) = worker_pids(frozen_out)
    for tag in ("j1", "j2"):
        wait_until(lambda tag=tag: redis_client.lrange(f"started:{tag}", 0, -1)
                   == [str(frozen)], message=f"{tag} to start in the first worker")
    os.kill(frozen, signal.SIGSTOP)
    try:
        fresh_host, fresh_out = spawned("default", "-c", "2", "--lease", "1", "--name", "fresh")
        (fresh,) = worker_pids(fresh_out)
        for tag in ("j1", "j2"):
            wait_until(lambda tag=tag: redis_client.lrange(f"started:{tag}", 0, -1)
                       == [str(frozen), str(fresh)], timeout=30,
                       message=f"{tag} to run again elsewhere:\n{fresh_out.text}")
        # The frozen worker wakes up: j1 finishes, j2 fails, both with the old attempt.
        redis_client.set(f"fail:j2:{frozen}", 1)
        for tag in ("j1", "j2"):
            redis_client.set(f"release:{tag}:{frozen}", 1)
    finally:
        os.kill(frozen, signal.SIGCONT)
    wait_until(lambda: stale_acks(frozen_out.lines) == 2, timeout=30,
               message=f"two stale acks:\n{frozen_out.text}")
    for job in jobs:
        job.refresh()
        assert (job.status, job.attempts, job.worker, job.error) == ("active", 2, "fresh-0",
                                                                    None)
        assert events_of(redis_client, keys, job.id).count("claimed") == 2
        assert not {"completed", "failed", "retried"} & set(events_of(redis_client, keys,
                                                                       job.id))
    for tag in ("j1", "j2"):
        redis_client.set(f"release:{tag}:{fresh}", 1)
    for job in jobs:
        wait_until(lambda job=job: job.refresh().status == "completed", message="newer run")
        assert (job.result, job.attempts, job.error) == (fresh, 2, None)
        history = events_of(redis_client, keys, job.id)
        assert history.count("completed") == 1
        assert not {"failed", "retried"} & set(history)
    fault_report("worker SIGSTOPped past its lease, then SIGCONT", 2, 0, 2)
    for proc in (frozen_host, fresh_host):
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


@pytest.fixture
def unreachable(settings):
    """Point DELAYQ at ``url`` with short timeouts; returns the setter."""

    def point(url: str) -> float:
        settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": url, "SOCKET_TIMEOUT": 0.5,
                           "SOCKET_CONNECT_TIMEOUT": 0.5}
        return 0.5

    return point


def test_enqueue_to_a_closed_port_raises_a_clear_connection_error(unreachable, fault_report):
    from django_delayq import DelayQConnectionError
    from django_delayq.testing import free_port
    from tests.testapp.tasks import record

    port = free_port()
    unreachable(f"redis://:s3cret@127.0.0.1:{port}/0")
    started = time.monotonic()
    with pytest.raises(DelayQConnectionError, match=f"Redis at redis://127.0.0.1:{port}/0 is "
                                                    "unreachable") as info:
        record.enqueue("nowhere")
    # Bounded by the socket timeouts, not hanging for a default or retrying for long.
    assert time.monotonic() - started < 5
    assert "s3cret" not in str(info.value)
    fault_report("enqueue with Redis down (closed port)", 1, 0, 0)


def test_enqueue_to_a_server_that_never_answers_times_out(unreachable):
    from django_delayq import DelayQConnectionError
    from tests.testapp.tasks import record

    with RedisServer() as server:
        timeout = unreachable(server.url)
        assert server.process is not None
        server.process.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(DelayQConnectionError, match="unreachable"):
                record.enqueue("frozen")
            assert time.monotonic() - started < 10 * timeout + 2
        finally:
            server.process.send_signal(signal.SIGCONT)
        # The server answers again: nothing half-written blocks the next enqueue.
        job = record.enqueue("thawed")
        assert job.refresh().status == "ready"


@pytest.mark.parametrize("operation", [
    "enqueue_many", "fetch", "counts", "pause", "purge", "jobs", "all", "throughput",
    "cancel", "reschedule",
])
def test_every_public_operation_raises_delayq_connection_error(unreachable, operation):
    from django_delayq import DelayQConnectionError, Job, Queue
    from django_delayq.testing import free_port
    from tests.testapp.tasks import record

    job = Job(id="some-job", queue="default")
    calls = {
        "enqueue_many": lambda: record.enqueue_many([("a",), ("b",)]),
        "fetch": lambda: Job.fetch("some-job"),
        "counts": lambda: Queue("default").counts(),
        "pause": lambda: Queue("default").pause(),
        "purge": lambda: Queue("default").purge(),
        "jobs": lambda: Queue("default").jobs("ready"),
        "all": Queue.all,
        "throughput": lambda: Queue("default").throughput(5),
        "cancel": job.cancel,
        "reschedule": lambda: job.reschedule(delay=5),
    }
    unreachable(f"redis://:s3cret@127.0.0.1:{free_port()}/0")
    with pytest.raises(DelayQConnectionError, match="unreachable") as info:
        calls[operation]()
    assert "s3cret" not in str(info.value)
