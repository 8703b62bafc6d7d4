"""Per-key flow control in the engine: concurrency keys, fair turns, dedupe keys."""

from __future__ import annotations

from typing import Any

import pytest

from django_delayq.engine import EnqueueRequest, Job, Queue
from django_delayq.engine.keyed import KeyedOptions, Outcome, encode
from django_delayq.engine.status import Status


def keyed(key: str, limit: int = 1) -> KeyedOptions:
    return KeyedOptions(key, limit)


def claim(broker: Any, count: int, queue: str = "default", worker: str = "w1") -> list[Any]:
    return [job for res in broker.claim(queue, count, worker) for job in res.jobs]


def complete(broker: Any, jobs: list[Any], queue: str = "default") -> None:
    batch = broker.batch()
    for job in jobs:
        broker.add_complete(batch, broker.keys_for(queue, job.id),
                            [(job.id, job.attempt, "null")])
    batch.run()


def key_of(broker: Any, job: Any, queue: str = "default") -> str:
    return broker.client.hget(broker.keys_for(queue, job.id).job(job.id), "ck")


def test_a_key_at_its_limit_parks_its_jobs_and_others_go_on(broker: Any) -> None:
    for i in range(6):
        broker.enqueue("default", "t.a", [i], keyed=keyed("A", 2))
    for i in range(3):
        broker.enqueue("default", "t.b", [i], keyed=keyed("B", 5))
    plain = broker.enqueue("default", "t.c", [0])
    jobs = claim(broker, 20)
    assert sorted(key_of(broker, j) or "-" for j in jobs) == ["-", "A", "A", "B", "B", "B"]
    keys = broker.keys_for("default", plain.job_id)
    assert broker.client.zscore(keys.key_active, "A") == 2
    assert broker.client.zscore(keys.key_waiting, "A") == 4
    assert claim(broker, 20) == []  # the 4 parked jobs wait for a slot
    queue = Queue("default", broker=broker)
    assert queue.counts()["ready"] == 4
    load = queue.key_load(top=1)
    assert (load.active, load.waiting, load.waiting_total) == ([("B", 3)], [("A", 4)], 4)
    parked = Job.fetch(broker.client.zrange(keys.parked("A"), 0, 0)[0], broker=broker)
    assert parked.status == "ready"
    assert parked.waiting_for_slot
    assert parked.concurrency_key == "A"
    a_jobs = [j for j in jobs if key_of(broker, j) == "A"]
    complete(broker, a_jobs[:1])
    again = claim(broker, 20)
    assert [key_of(broker, j) for j in again] == ["A"]
    assert [j.args_json for j in again] == ["[2]"]  # FIFO within the key
    complete(broker, [*a_jobs[1:], *again])
    rest = claim(broker, 20)
    assert [j.args_json for j in rest] == ["[3]", "[4]"]
    complete(broker, rest)
    last = claim(broker, 20)
    assert [j.args_json for j in last] == ["[5]"]
    complete(broker, last)
    assert broker.client.zscore(keys.key_active, "A") is None
    assert broker.client.zcard(keys.key_waiting) == 0
    assert broker.client.hlen(keys.key_turns) == 0


def test_failure_release_and_reclaim_free_the_slot(broker: Any) -> None:
    for i in range(4):
        broker.enqueue("default", "t.a", [i], keyed=keyed("A", 1), max_attempts=2)
    (first,) = claim(broker, 10)
    keys = broker.keys_for("default", first.id)
    batch = broker.batch()
    broker.add_fail(batch, keys, first.id, first.attempt, "E: x", "tb", 60_000)
    batch.run()  # retried later: its slot is free now
    (second,) = claim(broker, 10)
    batch = broker.batch()
    broker.add_release(batch, keys, [(second.id, second.attempt)], started=False)
    batch.run()
    (third,) = claim(broker, 10)
    assert third.id == second.id  # handed back at its old place
    # a lease that lapses frees the slot at the reclaim, not before
    broker.client.zadd(keys.active, {third.id: 1})
    assert claim(broker, 10) == []
    assert broker.reclaim("default") == (1, 0)
    (fourth,) = claim(broker, 10)
    assert fourth.id == third.id
    assert broker.client.zscore(keys.key_active, "A") == 1


def test_a_cancelled_parked_job_is_skipped(broker: Any) -> None:
    jobs = [broker.enqueue("default", "t.a", [i], keyed=keyed("A", 1)) for i in range(3)]
    (running,) = claim(broker, 10)
    assert claim(broker, 10) == []
    Job.fetch(jobs[1].job_id, queue="default", broker=broker).cancel()
    complete(broker, [running])
    (nxt,) = claim(broker, 10)
    assert nxt.id == jobs[2].job_id


def test_a_woken_job_cancelled_before_its_claim_wakes_the_next(broker: Any) -> None:
    """A freed slot wakes the key's oldest parked job, which holds no slot until it is
    claimed. Cancelled before that, it passes the wake on: the next parked job is not
    left waiting for a slot no job of the key will ever free."""
    jobs = [broker.enqueue("default", "t.a", [i], keyed=keyed("A", 1)) for i in range(3)]
    (running,) = claim(broker, 10)
    assert claim(broker, 10) == []  # both others parked
    complete(broker, [running])  # wakes the first parked one
    Job.fetch(jobs[1].job_id, queue="default", broker=broker).cancel()
    (nxt,) = claim(broker, 10)
    assert nxt.id == jobs[2].job_id
    keys = broker.keys_for("default", nxt.id)
    assert broker.client.zscore(keys.key_active, "A") == 1
    assert broker.client.zcard(keys.key_waiting) == 0


def test_a_woken_job_moved_later_before_its_claim_wakes_the_next(broker: Any) -> None:
    jobs = [broker.enqueue("default", "t.a", [i], keyed=keyed("A", 1)) for i in range(3)]
    (running,) = claim(broker, 10)
    assert claim(broker, 10) == []
    complete(broker, [running])
    Job.fetch(jobs[1].job_id, queue="default", broker=broker).reschedule(delay=3600)
    (nxt,) = claim(broker, 10)
    assert nxt.id == jobs[2].job_id


def test_a_parked_job_cancelled_or_moved_leaves_its_park_set(broker: Any) -> None:
    """A parked job that is cancelled or moved waits for no slot: the key's waiting
    count drops at once, and a purge of the ready jobs (which reaches the parked ones)
    leaves the moved job, now scheduled, alone."""
    jobs = [broker.enqueue("default", "t.a", [i], keyed=keyed("A", 1)).job_id
            for i in range(4)]
    (running,) = claim(broker, 10)
    assert claim(broker, 10) == []  # three parked
    keys = broker.keys_for("default", running.id)
    Job.fetch(jobs[1], queue="default", broker=broker).reschedule(delay=3600)
    Job.fetch(jobs[2], queue="default", broker=broker).cancel()
    queue = Queue("default", broker=broker)
    assert broker.client.zrange(keys.parked("A"), 0, -1) == [jobs[3]]
    assert queue.key_load().waiting_total == 1
    moved = Job.fetch(jobs[1], queue="default", broker=broker)
    assert (moved.status, moved.waiting_for_slot) == ("scheduled", False)
    assert queue.purge((Status.READY,)) == 1
    assert Job.fetch(jobs[1], queue="default", broker=broker).status == "scheduled"
    assert queue.key_load().waiting_total == 0
    complete(broker, [running])
    assert claim(broker, 10) == []
    Job.fetch(jobs[1], queue="default", broker=broker).reschedule(delay=0)
    (last,) = claim(broker, 10)
    assert last.id == jobs[1]
    complete(broker, [last])
    assert broker.client.zcard(keys.key_active) == 0


@pytest.mark.parametrize(("field", "value"), [("kr", "0"), ("kr", "-3"), ("kp", "0"),
                                            ("cl", "0"), ("cl", "-1")])
def test_a_damaged_key_rate_or_limit_loses_no_job_of_the_batch(broker, field, value):
    """A stored rate or limit no check would let through (a damaged record) is read as
    no rate and a limit of one: the claim takes the batch, never raises half way (which
    would leave the jobs it had popped in no set at all)."""
    ids = [broker.enqueue("default", "t.a", [i],
                          keyed=KeyedOptions("A", 2, rate_limit=5, rate_period_ms=1000))
           .job_id for i in range(3)]
    keys = broker.keys_for("default", ids[1])
    broker.client.hset(keys.job(ids[1]), field, value)
    claimed = claim(broker, 10)
    assert claimed, "the claim went through"
    counts = Queue("default", broker=broker).counts()
    assert counts["active"] + counts["ready"] + counts["scheduled"] == 3
    complete(broker, claimed)
    rest = claim(broker, 10)
    complete(broker, rest)
    assert sorted(j.id for j in [*claimed, *rest]) == sorted(ids)


def test_the_turn_goes_with_a_last_job_cancelled_while_parked_or_moved(broker: Any) -> None:
    parked = [broker.enqueue("default", "t.a", [i], keyed=keyed("P", 1)) for i in range(2)]
    (running,) = claim(broker, 10)
    assert claim(broker, 10) == []  # the other one parked
    keys = broker.keys_for("default", running.id)
    Job.fetch(parked[1].job_id, queue="default", broker=broker).cancel()
    moved = broker.enqueue("default", "t.a", [0], keyed=keyed("M", 1))
    Job.fetch(moved.job_id, queue="default", broker=broker).reschedule(delay=3600)
    Job.fetch(moved.job_id, queue="default", broker=broker).cancel()
    assert broker.client.hgetall(keys.key_turns) == {}
    complete(broker, [running])
    assert claim(broker, 10) == []


def test_the_turn_of_a_key_whose_last_job_is_cancelled_is_not_kept(broker: Any) -> None:
    """A key's turn (its last FIFO number) is dropped with its last job, claimed or
    cancelled: with a key per user, kept turns would grow without a bound."""
    jobs = [broker.enqueue("default", "t.a", [i], keyed=keyed(f"user-{i}", 1))
            for i in range(100)]
    keys = broker.keys_for("default", jobs[0].job_id)
    assert broker.client.hlen(keys.key_turns) == 100
    for job in jobs[:50]:
        Job.fetch(job.job_id, queue="default", broker=broker).cancel()
    assert broker.client.hlen(keys.key_turns) == 50
    assert Queue("default", broker=broker).purge((Status.READY,)) == 50
    assert broker.client.hlen(keys.key_turns) == 0


@pytest.mark.parametrize("move", [{"priority": 5}, {"delay": 0}])
def test_the_turn_of_a_key_whose_last_job_is_moved_is_not_kept(broker: Any,
                                                                move: dict[str, Any]) -> None:
    jobs = [broker.enqueue("default", "t.a", [i], keyed=keyed(f"user-{i}", 1))
            for i in range(50)]
    keys = broker.keys_for("default", jobs[0].job_id)
    for job in jobs:
        Job.fetch(job.job_id, queue="default", broker=broker).reschedule(**move)
    while claimed := claim(broker, 20):
        complete(broker, claimed)
    assert broker.client.hlen(keys.key_turns) == 0
    assert broker.client.zcard(keys.key_active) == 0


def test_fair_turns_between_keys(broker: Any) -> None:
    """100,000 jobs of key A, then 10 of key B: B's all start within the first 21 claims
    (the keys alternate), and each key's jobs keep their order."""
    broker.enqueue_many("default", (
        EnqueueRequest(task="t.a", args=[i], keyed=keyed("A", 100_000))
        for i in range(100_000)))
    late = broker.enqueue_many("default", [
        EnqueueRequest(task="t.b", args=[i], keyed=keyed("B", 100_000)) for i in range(10)])
    order = [job for _ in range(21) for job in claim(broker, 1)]
    b_jobs = [job for job in order if job.id in late.job_ids]
    assert [job.args_json for job in b_jobs] == [f"[{i}]" for i in range(10)]
    a_jobs = [job for job in order if job.id not in late.job_ids]
    assert [job.args_json for job in a_jobs] == [f"[{i}]" for i in range(11)]


def test_dedupe_modes(broker: Any) -> None:
    opts = encode(None, None, "digest", "debounce", 30)
    first = broker.enqueue("default", "t.d", [1], keyed=opts, delay=30)
    assert first.outcome is Outcome.CREATED
    assert first.status == "scheduled"
    second = broker.enqueue("default", "t.d", [2], keyed=opts, delay=30)
    assert second.outcome is Outcome.REPLACED
    assert second.job_id == first.job_id
    assert second.run_at_ms >= first.run_at_ms
    keys = broker.keys_for("default", first.job_id)
    assert broker.client.hget(keys.job(first.job_id), "a") == "[2]"
    assert broker.client.zcard(keys.scheduled) == 1

    throttle = encode(None, None, "refresh", "throttle", 10)
    one = broker.enqueue("default", "t.r", [1], keyed=throttle)
    two = broker.enqueue("default", "t.r", [2], keyed=throttle)
    assert (one.outcome, two.outcome) == (Outcome.CREATED, Outcome.IGNORED)
    assert two.job_id == one.job_id

    last = encode(None, None, "sync", "keep_last", None)
    a = broker.enqueue("default", "t.s", [1], keyed=last)
    b = broker.enqueue("default", "t.s", [2], keyed=last)
    assert b.outcome is Outcome.REPLACED
    assert b.job_id == a.job_id
    claimed = [j for j in claim(broker, 10) if j.task == "t.s"]
    assert [j.args_json for j in claimed] == ["[2]"]
    c = broker.enqueue("default", "t.s", [3], keyed=last)  # one runs: this one waits
    assert c.outcome is Outcome.CREATED
    assert c.job_id != a.job_id
    d = broker.enqueue("default", "t.s", [4], keyed=last)
    assert d.outcome is Outcome.REPLACED
    assert d.job_id == c.job_id
    assert [j for j in claim(broker, 10) if j.task == "t.s"] == []  # limit 1 per key


@pytest.mark.parametrize("kwargs", [
    {"concurrency_key": "", "concurrency_limit": 2},
    {"concurrency_key": "a", "concurrency_limit": 0},
    {"concurrency_key": 3},
    {"dedupe_key": "a", "dedupe": "sometimes"},
    {"dedupe_key": "a", "dedupe": "throttle"},
    {"concurrency_limit": 2},
])
def test_bad_options_are_refused(kwargs: dict[str, Any]) -> None:
    args = {"concurrency_key": None, "concurrency_limit": None, "dedupe_key": None,
            "dedupe": None, "window": None}
    args.update(kwargs)
    with pytest.raises((TypeError, ValueError)):
        encode(args["concurrency_key"], args["concurrency_limit"], args["dedupe_key"],
               args["dedupe"], args["window"])


def test_a_key_rate_limit_schedules_the_starts_over_it(broker: Any) -> None:
    opts = encode("R", None, None, None, None, "2/s")
    assert opts is not None
    ids = [broker.enqueue("default", "t.r", [i], keyed=opts).job_id for i in range(5)]
    broker.enqueue("default", "t.o", [0])
    (res,) = broker.claim("default", 10, "w1")
    assert sorted(j.args_json for j in res.jobs if j.task == "t.r") == ["[0]", "[1]"]
    assert [j.task for j in res.jobs if j.task == "t.o"] == ["t.o"]  # not held back
    later = [Job.fetch(job_id, broker=broker) for job_id in ids[2:]]
    assert {job.status for job in later} == {"scheduled"}
    for job in later:  # the window's next start: a second after the first two
        assert job.run_at is not None
        assert job.run_at.timestamp() * 1000 >= res.now_ms + 1000 - 1
    assert res.next_due_ms is not None
    assert res.next_due_ms >= res.now_ms + 1000 - 1


def test_purge_reaches_the_parked_jobs(broker: Any) -> None:
    ids = [broker.enqueue("default", "t.a", [i], keyed=keyed("A", 1)).job_id for i in range(4)]
    (running,) = claim(broker, 10)
    queue = Queue("default", broker=broker)
    assert queue.counts()["ready"] == 3
    assert queue.purge(("ready",)) == 3
    assert queue.counts()["ready"] == 0
    assert queue.key_load().waiting_total == 0
    complete(broker, [running])
    assert claim(broker, 10) == []  # nothing parked comes back
    assert [job_id for job_id in ids if broker.client.exists(
        broker.keys_for("default", job_id).job(job_id))] == [running.id]
