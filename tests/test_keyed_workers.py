"""Per-key flow control through real ``runworker`` processes: concurrency limits held
across workers and a process pool, slots of killed workers, debounce."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any

from django_delayq import Job
from django_delayq.connection import get_broker
from tests.conftest import kill_with_children, wait_until, worker_pids
from tests.testapp import keyed_tasks
from tests.testapp.keyed_tasks import PEAK, RUNNING, RUNS, per_tenant


def runs(client: Any) -> list[list[Any]]:
    return [json.loads(x) for x in client.lrange(RUNS, 0, -1)]


def drained(client: Any, queue: str = "default") -> bool:
    keys = get_broker().shards(queue)
    return all(client.zcard(k.active) + client.zcard(k.ready) + client.zcard(k.scheduled) == 0
               for k in keys)


class Sampler(threading.Thread):
    """Reads, every 2 ms, how many jobs of ``key`` hold a slot (the shard's count) and
    how many run their body; keeps the highest of each."""

    def __init__(self, client: Any, key: str) -> None:
        super().__init__(daemon=True)
        self.client, self.key, self.stop = client, key, threading.Event()
        self.slots = self.running = self.samples = 0
        self.keys = get_broker().shards("default")[0]

    def run(self) -> None:
        while not self.stop.is_set():
            pipe = self.client.pipeline(transaction=False)
            pipe.zscore(self.keys.key_active, self.key)
            pipe.hget(RUNNING, self.key)
            slots, running = pipe.execute()
            self.slots = max(self.slots, int(float(slots or 0)))
            self.running = max(self.running, int(running or 0))
            self.samples += 1
            time.sleep(0.002)


def test_a_key_never_runs_more_than_its_limit_while_other_keys_run(spawned, redis_client):
    heavy = [(f"A:{i}", 0.002) for i in range(1000)]
    others = [(f"B{i % 50}:{i}", 0.002) for i in range(2000)]
    per_tenant.enqueue_many(heavy + others)
    sampler = Sampler(redis_client, "A")
    sampler.start()
    spawned("default", "-c", "4")
    spawned("default", "-c", "4")
    spawned("default", "-c", "3", "--processes", "2")
    try:
        wait_until(lambda: redis_client.llen(RUNS) >= 3000, timeout=600,
                   message="3,000 keyed jobs run")
        wait_until(lambda: drained(redis_client), timeout=60, message="the queue drained")
    finally:
        sampler.stop.set()
        sampler.join()
    peaks = {key: int(value) for key, value in redis_client.hgetall(PEAK).items()}
    print(f"samples={sampler.samples} peak slots A={sampler.slots} "
          f"peak running A={sampler.running} peaks={sorted(peaks.items())[:5]}")
    assert len(runs(redis_client)) == 3000
    assert peaks["A"] == 2  # the limit was reached, never passed
    assert all(peak <= 2 for key, peak in peaks.items() if key != "*")
    assert sampler.slots <= 2
    assert sampler.running <= 2
    assert sampler.samples > 100
    # the other keys ran alongside A: more than A's 2 jobs ran at once in all
    assert int(redis_client.hget(PEAK, "*") or 0) > 2
    keys = get_broker().shards("default")[0]
    assert redis_client.zcard(keys.key_active) == 0  # no slot leaked
    assert redis_client.zcard(keys.key_waiting) == 0


def test_a_killed_workers_slot_frees_after_its_lease_never_before(spawned, redis_client):
    one = per_tenant.using(concurrency_limit=1)
    proc, _ = spawned("default", "-c", "2", "--lease", "3")
    first = one.enqueue("K:1", 0.0, "test:gate")
    second = one.enqueue("K:2")
    wait_until(lambda: redis_client.llen(RUNS) == 1, timeout=120, message="the first job ran")
    kill_with_children(proc)  # host and worker: nobody hands the lease back
    keys = get_broker().keys_for("default", first.id)
    deadline = float(redis_client.zscore(keys.active, first.id))
    redis_client.set("test:gate", 1)
    spawned("default", "-c", "2", "--lease", "3")
    wait_until(lambda: Job.fetch(second.id).status == "completed", timeout=120,
               message="the second job ran after the reclaim")
    wait_until(lambda: Job.fetch(first.id).status == "completed", timeout=120,
               message="the first job ran again")
    started = Job.fetch(second.id).started_at
    assert started is not None
    assert started.timestamp() * 1000 >= deadline  # never before the lease lapsed
    assert redis_client.zcard(keys.key_active) == 0


def test_a_worker_process_that_dies_frees_its_slot_at_once(spawned, redis_client):
    """The host sees its worker process end and hands back its leases (reclaim by
    worker name): the slot is freed then, and the key goes on."""
    one = per_tenant.using(concurrency_limit=1)
    _, out = spawned("default", "-c", "2", "--lease", "300")
    first = one.enqueue("K:1", 0.0, "test:gate")
    second = one.enqueue("K:2")
    sampler = Sampler(redis_client, "K")
    sampler.start()
    wait_until(lambda: redis_client.llen(RUNS) == 1, timeout=120, message="the first job ran")
    (pid,) = worker_pids(out)
    redis_client.set("test:gate", 1)
    os.kill(pid, signal.SIGKILL)  # the lease (300 s) is far: only the host frees the slot
    try:
        wait_until(lambda: Job.fetch(second.id).status == "completed", timeout=120,
                   message="the second job ran after the worker-name reclaim")
        wait_until(lambda: Job.fetch(first.id).status == "completed", timeout=120,
                   message="the first job ran again")
    finally:
        sampler.stop.set()
        sampler.join()
    assert sampler.slots == 1
    lost = [a for a in Job.fetch(first.id).attempt_log if a["outcome"] == "reclaimed"]
    assert lost
    assert Job.fetch(second.id).started_at >= lost[0]["finished_at"]
    assert redis_client.zcard(get_broker().keys_for("default", first.id).key_active) == 0


def test_debounce_runs_once_with_the_last_arguments(spawned, redis_client):
    digest = keyed_tasks.digest.using(dedupe_key="digest:7", dedupe="debounce",
                                      dedupe_window=6)
    spawned("default", "-c", "2")
    outcomes = []
    # about 5 s of changes; a window of 6 s, so a stall of this process between two
    # changes (a busy machine) does not let the digest run in between
    for version in range(1000):
        outcomes.append(digest.enqueue("digest:7", version).outcome)
        time.sleep(0.005)
    assert outcomes[0] == "created"
    assert set(outcomes[1:]) == {"replaced"}
    wait_until(lambda: runs(redis_client), timeout=120, message="the digest sent")
    wait_until(lambda: drained(redis_client), timeout=60, message="nothing left to run")
    assert runs(redis_client) == [["digest:7", 999]]


def test_a_key_with_one_job_takes_its_turn_before_a_huge_backlog(spawned, redis_client):
    """20,000 jobs of key A, then 10 of key B: a runworker (one thread, no prefetch)
    starts B's all within its first ~20 jobs, A's in order."""
    fair = per_tenant.using(concurrency_limit=100_000)
    fair.enqueue_many([(f"A:{i}",) for i in range(20_000)])
    fair.enqueue_many([(f"B:{i}",) for i in range(10)])
    spawned("default", "-c", "1", "--prefetch", "0")
    wait_until(lambda: redis_client.llen(RUNS) >= 40, timeout=120, message="40 jobs run")
    first = [tag for _, tag in runs(redis_client)[:40]]
    b_at = [i for i, tag in enumerate(first) if tag.startswith("B:")]
    assert len(b_at) == 10
    assert b_at[-1] < 22, first
    assert [tag for tag in first if tag.startswith("A:")] == [
        f"A:{i}" for i in range(40 - 10)]
