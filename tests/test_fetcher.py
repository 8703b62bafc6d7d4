"""The fetcher's claim rounds on a real Redis: whole batches from one shard with a
backlog at a time, full rounds so that no shard starves, order within each shard."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from django_delayq import JobSpec, Queue
from django_delayq.connection import get_broker
from django_delayq.engine import Broker, ClaimedJob, QueueKeys
from django_delayq.runtime.worker import fetcher as fetcher_module
from django_delayq.worker import Worker
from tests.conftest import ran, wait_until, worker_thread
from tests.test_flow_control import claim_times
from tests.testapp import tasks

SPREAD = {"spread": {"shards": 3}}


def ids_on(broker: Broker, queue: str, shard: QueueKeys, n: int, prefix: str) -> list[str]:
    """``n`` job ids of ``queue`` that fall on ``shard``."""
    ids: list[str] = []
    i = 0
    while len(ids) < n:
        job_id = f"{prefix}{i}"
        if broker.keys_for(queue, job_id) == shard:
            ids.append(job_id)
        i += 1
    return ids


def spy_rounds(broker: Broker, monkeypatch: pytest.MonkeyPatch,
               ) -> list[tuple[dict[QueueKeys, int], dict[QueueKeys, list[ClaimedJob]]]]:
    """Each claim round trip of ``broker`` as (what each shard was asked, what it gave);
    the calls still go to Redis."""
    rounds: list[tuple[dict[QueueKeys, int], dict[QueueKeys, list[ClaimedJob]]]] = []
    real = broker.claim_many

    def claim_many(wants: Any, *args: Any, **kwargs: Any) -> Any:
        results = real(wants, *args, **kwargs)
        rounds.append((dict(wants), {r.keys: r.jobs for r in results}))
        return results

    monkeypatch.setattr(broker, "claim_many", claim_many)
    return rounds


def test_a_busy_worker_claims_whole_batches_from_one_shard_at_a_time_in_turn(
        settings, monkeypatch):
    # Quiet shards asked only when no shard has a backlog or the one asked is empty:
    # the rounds then follow from the backlogs alone.
    monkeypatch.setattr(fetcher_module, "QUIET_SHARD_INTERVAL", 3600.0)
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": SPREAD}
    broker = get_broker()
    shards = broker.shards("spread")
    order = {}  # job id -> (shard, -priority, position in its shard's enqueue order)
    specs = []
    for keys in shards:
        for n, job_id in enumerate(ids_on(broker, "spread", keys, 30, "j")):
            priority = (n * 7) % 5 - 2
            order[job_id] = (keys, -priority, n)
            specs.append(JobSpec([job_id], job_id=job_id, priority=priority))
    tasks.record.using(queue="spread").enqueue_many(specs)
    rounds = spy_rounds(broker, monkeypatch)
    fetcher = Worker(["spread"], concurrency=2, prefetch=4, burst=True, broker=broker).fetcher
    claimed = 0
    for _ in range(40):
        got, _ = fetcher.claim(6)
        claimed += got
        if not got:
            break
    assert claimed == 90
    # The first round shares the capacity between every shard (2 each); each gave all
    # it was asked, so each has a backlog. Then each round asks one shard for all 6, in
    # turn: four turns each (28 = 6 + 6 + 6 + 6 + 4, the fourth came back short). The
    # last round asks every shard again and finds them empty.
    assert rounds[0][0] == dict.fromkeys(shards, 2)
    focused = rounds[1:16]
    assert all(len(asked) == 1 and list(asked.values()) == [6] for asked, _ in focused)
    turns = [next(iter(asked)) for asked, _ in focused]
    for i in range(0, 15, 3):
        assert set(turns[i:i + 3]) == set(shards), turns
    assert [sum(map(len, gave.values())) for _, gave in focused] == [6] * 12 + [4] * 3
    assert rounds[16][0] == dict.fromkeys(shards, 2)
    assert sum(map(len, rounds[16][1].values())) == 0
    assert len(rounds) == 17
    assert all(sum(asked.values()) <= 6 for asked, _ in rounds), "never more than free"
    # Every job once; within each shard, higher priority first, FIFO within one.
    jobs = [job for _, gave in rounds for batch in gave.values() for job in batch]
    assert Counter(job.id for job in jobs) == Counter(set(order))
    for keys in shards:
        mine = [order[job.id] for job in jobs if job.keys == keys]
        assert mine == sorted(mine)


def test_quiet_shards_are_asked_for_a_job_along_with_a_backlog(settings, monkeypatch):
    monkeypatch.setattr(fetcher_module, "QUIET_SHARD_INTERVAL", 0.0)  # in every round
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": SPREAD}
    broker = get_broker()
    shards = broker.shards("spread")
    busy, quiet, empty = shards
    tasks.record.using(queue="spread").enqueue_many(
        JobSpec([job_id], job_id=job_id) for job_id in ids_on(broker, "spread", busy, 40, "b"))
    rounds = spy_rounds(broker, monkeypatch)
    fetcher = Worker(["spread"], concurrency=2, prefetch=4, burst=True, broker=broker).fetcher
    assert fetcher.claim(6)[0] == 2
    assert rounds[-1][0] == dict.fromkeys(shards, 2)
    # Only the busy shard gave all it was asked: the others are asked for one job each,
    # the busy one for the rest (never more than 6 in all).
    assert fetcher.claim(6)[0] == 4
    assert rounds[-1][0] == {busy: 4, quiet: 1, empty: 1}
    [late] = ids_on(broker, "spread", quiet, 1, "q")
    tasks.record.using(queue="spread", job_id=late).enqueue("late")
    assert fetcher.claim(6)[0] == 5
    asked, gave = rounds[-1]
    assert asked == {busy: 4, quiet: 1, empty: 1}
    assert [job.id for job in gave[quiet]] == [late]
    # The quiet shard gave its one job: its turn comes (the busy one waits for its own);
    # it comes back empty, so every shard is asked.
    assert fetcher.claim(6)[0] == 2
    assert [asked for asked, _ in rounds[-2:]] == [{quiet: 5, empty: 1},
                                                   dict.fromkeys(shards, 2)]


def test_sharded_unsharded_and_limited_queues_are_claimed_together(settings, monkeypatch):
    monkeypatch.setattr(fetcher_module, "QUIET_SHARD_INTERVAL", 3600.0)
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {
        **SPREAD, "metered": {"rate_limit": "1000/s"}}}
    broker = get_broker()
    tasks.record.using(queue="spread").enqueue_many(
        [JobSpec([f"s{i}"], job_id=f"s{i}") for i in range(60)])
    tasks.record.using(queue="plain").enqueue_many(
        [JobSpec([f"p{i}"], job_id=f"p{i}") for i in range(40)])
    tasks.record.using(queue="metered").enqueue_many(
        [JobSpec([f"m{i}"], job_id=f"m{i}") for i in range(5)])
    rounds = spy_rounds(broker, monkeypatch)
    worker = Worker(["spread", "plain", "metered"], concurrency=8, prefetch=0, burst=True,
                    broker=broker)
    [metered] = broker.shards("metered")
    [plain] = broker.shards("plain")
    claimed = 0
    for _ in range(60):
        got, _ = worker.fetcher.claim(8)
        claimed += got
        # the threads ran them: idle again, so the limited queue may be claimed
        worker.ledger.settle(job for batch in rounds[-1][1].values() for job in batch)
        if not got:
            break
    assert claimed == 105
    # The limited queue is asked in every round, its share of the split (8 over 5
    # shards: 1 or 2), and no round asks for more than 8 in all.
    assert all(asked[metered] in (1, 2) for asked, _ in rounds)
    assert all(sum(asked.values()) <= 8 for asked, _ in rounds)
    # The unsharded queue takes its turns among the sharded queue's shards.
    focused = [next(k for k in asked if k != metered) for asked, _ in rounds
               if len(asked) == 2]
    assert plain in focused
    assert {k.queue for k in focused} == {"spread", "plain"}
    jobs = [job.id for _, gave in rounds for batch in gave.values() for job in batch]
    assert sorted(jobs) == sorted([f"s{i}" for i in range(60)] + [f"p{i}" for i in range(40)]
                                  + [f"m{i}" for i in range(5)])


def test_a_shard_without_a_backlog_is_served_while_another_keeps_the_worker_busy(
        settings, redis_client):
    """A job that arrives on a quiet shard while another shard's backlog keeps every
    thread busy starts within a full round, long before that backlog is drained."""
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": SPREAD}
    broker = get_broker()
    busy, quiet, _ = broker.shards("spread")
    backlog = ids_on(broker, "spread", busy, 6000, "b")
    tasks.add.using(queue="spread").enqueue_many(
        JobSpec([1, 2], job_id=job_id) for job_id in backlog)
    [late] = ids_on(broker, "spread", quiet, 1, "q")
    queue = Queue("spread")
    with worker_thread(queues=["spread"], concurrency=4) as worker:
        wait_until(lambda: queue.counts()["completed"] >= 200, message="the backlog to run")
        job = tasks.record.using(queue="spread", job_id=late).enqueue("late")
        wait_until(lambda: job.refresh().status == "completed", message="the quiet shard")
        wait_until(lambda: queue.counts()["completed"] == 6001, timeout=60,
                   message="the backlog drained")
        assert worker.fetcher.rotation > 0
    assert [r["tag"] for r in ran(redis_client)] == ["late"]
    claims = claim_times("spread")
    after = sum(1 for job_id in backlog if claims[job_id] > claims[late])
    # claimed while the busy shard still had jobs waiting: it did not wait for them
    assert after > 0, "the quiet shard's job waited for the busy shard's whole backlog"
