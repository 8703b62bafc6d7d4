"""Weighted fair turns: a key of weight w takes w turns for each turn of a key of weight
1 while both have a backlog, FIFO within each key; bad weights are refused before
anything is written. On the engine, and through a real ``runworker``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from django_delayq.engine import EnqueueRequest
from django_delayq.engine.keyed import MAX_WEIGHT, KeyedOptions, encode
from tests.conftest import wait_until
from tests.testapp.keyed_tasks import RUNS, per_tenant


def weighted(key: str, weight: int) -> KeyedOptions | None:
    return encode(key, None, None, None, None, None, weight)


def shares(order: list[str], block: int) -> list[int]:
    """How many of each ``block`` consecutive entries of ``order`` are key B's."""
    return [sum(tag == "B" for tag in order[i:i + block])
            for i in range(0, len(order) - block + 1, block)]


def test_a_key_of_weight_3_takes_3_turns_for_each_of_a_key_of_weight_1(broker: Any) -> None:
    """300 jobs of A (weight 1), then 300 of B (weight 3): the first 200 claims hold 150
    of B's and 50 of A's, 3 of B's in every 4 (within one: the keys' equal numbers are
    ordered by job id), each key's in its order."""
    a = broker.enqueue_many("default", [
        EnqueueRequest(task="t.a", args=[i], keyed=weighted("A", 1)) for i in range(300)])
    broker.enqueue_many("default", [
        EnqueueRequest(task="t.b", args=[i], keyed=weighted("B", 3)) for i in range(300)])
    claimed = [job for _ in range(200) for res in broker.claim("default", 1, "w1")
               for job in res.jobs]
    order = ["A" if job.id in a.job_ids else "B" for job in claimed]
    assert order.count("B") == 150
    assert all(2 <= n <= 4 for n in shares(order, 4)), order
    assert [job.args_json for job in claimed if job.task == "t.a"] == [
        f"[{i}]" for i in range(50)]
    assert [job.args_json for job in claimed if job.task == "t.b"] == [
        f"[{i}]" for i in range(150)]


def redis_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_weights_hold_for_scheduled_jobs_made_ready_by_the_claim(broker: Any) -> None:
    """Jobs due later take their turns when the claim promotes them (claim.lua), with
    the weight stored in the job ('cw'; a job of weight 1 stores none): 40 of A
    (weight 1) and 80 of B (weight 4) make 4 of B's in every 5 claims."""
    a = broker.enqueue_many("default", [
        EnqueueRequest(task="t.a", args=[i], keyed=weighted("A", 1), delay=0.05)
        for i in range(40)])
    b = broker.enqueue_many("default", [
        EnqueueRequest(task="t.b", args=[i], keyed=weighted("B", 4), delay=0.05)
        for i in range(80)])
    keys = broker.keys_for("default", b.job_ids[0])
    assert broker.client.hget(keys.job(b.job_ids[0]), "cw") == "4"
    assert broker.client.hget(keys.job(a.job_ids[0]), "cw") is None
    due = int(broker.client.zrange(keys.scheduled, -1, -1, withscores=True)[0][1])
    wait_until(lambda: redis_ms(broker.client) > due, timeout=10, message="every job due")
    claimed = [job for _ in range(50) for res in broker.claim("default", 1, "w1")
               for job in res.jobs]
    order = ["A" if job.id in a.job_ids else "B" for job in claimed]
    # jobs due at the same ms are promoted in id order (as without keys): the shares
    # are what the weights decide
    assert order.count("B") == 40
    assert all(3 <= n <= 5 for n in shares(order, 5)), order


def test_jobs_without_keys_keep_fifo_and_each_take_a_turn(broker: Any) -> None:
    """A plain job takes one turn, as a job of a key of weight 1 does: 5 plain jobs
    enqueued after a key's backlog of 20 alternate with it (the i-th plain one is the
    2i-th or (2i+1)-th claimed), in their order."""
    backlog = broker.enqueue_many("default", [
        EnqueueRequest(task="t.a", args=[i], keyed=weighted("A", 1)) for i in range(20)])
    plain = [broker.enqueue("default", "t.p", [i]).job_id for i in range(5)]
    claimed = [job.id for _ in range(25) for res in broker.claim("default", 1, "w1")
               for job in res.jobs]
    at = [claimed.index(job_id) for job_id in plain]
    assert at == sorted(at)
    assert all(2 * i <= position <= 2 * i + 1 for i, position in enumerate(at)), at
    assert [job_id for job_id in claimed if job_id not in plain] == backlog.job_ids


@pytest.mark.parametrize("weight", [0, -1, 1.5, "3", True, MAX_WEIGHT + 1, 10**9])
def test_bad_weights_are_refused_before_anything_is_written(weight: Any,
                                                            redis_client: Any) -> None:
    before = redis_client.dbsize()
    with pytest.raises(ValueError, match="key_weight must be an int from 1 to 16"):
        per_tenant.using(key_weight=weight)
    with pytest.raises(ValueError, match="key_weight"):
        weighted("A", weight)
    with pytest.raises(ValueError, match="key_weight"):  # from a callable key at enqueue
        per_tenant.using(concurrency_key=lambda tag: tag, key_weight=weight).enqueue("A:1")
    assert redis_client.dbsize() == before


def test_a_weight_needs_a_concurrency_key() -> None:
    with pytest.raises(ValueError, match="key_weight need a concurrency_key"):
        encode(None, None, None, None, None, None, 2)
    with pytest.raises(ValueError, match="key_weight need a concurrency_key"):
        encode(None, None, "d", "throttle", 5, None, 2)
    options = weighted("A", 2)
    assert options is not None
    assert (options.concurrency_limit, options.weight) == (100_000, 2)  # no limit asked


def test_a_runworker_starts_a_weight_3_key_three_times_as_often(spawned, redis_client):
    """400 jobs of A (weight 1) and 400 of B (weight 3), enqueued alternately; a
    runworker with one thread and no prefetch starts them one claim at a time: in the
    first 400 starts, B's share is 3/4 (300 +- 4) and 3 +- 1 of each 4, FIFO per key."""
    a = per_tenant.using(concurrency_limit=100_000, key_weight=1)
    b = per_tenant.using(concurrency_limit=100_000, key_weight=3)
    for i in range(0, 400, 100):
        a.enqueue_many([(f"A:{j}",) for j in range(i, i + 100)])
        b.enqueue_many([(f"B:{j}",) for j in range(i, i + 100)])
    spawned("default", "-c", "1", "--prefetch", "0")
    wait_until(lambda: redis_client.llen(RUNS) >= 400, timeout=300, message="400 jobs run")
    tags = [json.loads(x)[1] for x in redis_client.lrange(RUNS, 0, 399)]
    order = [tag.split(":")[0] for tag in tags]
    print(f"B's starts per 40: {shares(order, 40)}")
    assert abs(order.count("B") - 300) <= 4, order
    assert all(2 <= n <= 4 for n in shares(order, 4)), order
    for key in "AB":
        assert [tag for tag in tags if tag.startswith(key)] == [
            f"{key}:{i}" for i in range(order.count(key))]


def test_the_heaviest_weight_is_one_fifo_number_a_job() -> None:
    """A job of weight w moves its key TURN / w numbers on: the heaviest weight allowed
    must still move it at least one, or two of its jobs could share a number."""
    from django_delayq.engine import scripts

    text = scripts.read_lua("includes/turn.lua")
    (turn,) = [int(line.split("=")[1]) for line in text.splitlines()
               if line.startswith("local TURN =")]
    assert turn == MAX_WEIGHT
