"""Dedupe modes in ``enqueue_many``: each job of a call sees what the jobs before it did,
in the one script call of its chunk, and the totals and results say what happened."""

from __future__ import annotations

import json
from typing import Any

from django_delayq.engine import EnqueueRequest, EnqueueResult, Job
from django_delayq.engine.keyed import Outcome, encode
from tests.conftest import round_trips, wait_until
from tests.testapp import keyed_tasks
from tests.testapp.keyed_tasks import RUNS


def request(i: int, key: str, mode: str, window: float | None = None,
            delay: float | None = None) -> EnqueueRequest:
    return EnqueueRequest(task="t.d", args=[i], delay=delay,
                          keyed=encode(None, None, key, mode, window))


def test_modes_of_several_keys_in_one_call(broker: Any) -> None:
    """One call: 3 debounced jobs of key d (the first created, the others replace its
    arguments and push its start), 3 throttled of key t (one created, two ignored), 2 of
    keep_last key k (one created, one replaces), a plain job, one round trip."""
    results: list[EnqueueResult] = []
    broker.enqueue("default", "t.w", [0])  # the script loaded
    with round_trips() as sent:
        total = broker.enqueue_many("default", [
            request(0, "d", "debounce", 30, delay=30), request(1, "t", "throttle", 60),
            request(2, "d", "debounce", 30, delay=31), request(3, "k", "keep_last"),
            request(4, "t", "throttle", 60), request(5, "d", "debounce", 30, delay=32),
            request(6, "k", "keep_last"), request(7, "t", "throttle", 60),
            EnqueueRequest(task="t.p", args=[8])], results=results)
    assert len(sent) == 1, sent
    assert "EVALSHA" in sent[0], sent
    assert [r.outcome for r in results] == [
        Outcome.CREATED, Outcome.CREATED, Outcome.REPLACED, Outcome.CREATED,
        Outcome.IGNORED, Outcome.REPLACED, Outcome.REPLACED, Outcome.IGNORED,
        Outcome.CREATED]
    assert (total.enqueued, total.replaced, total.ignored, total.duplicates) == (4, 3, 2, 0)
    ids = total.job_ids
    assert ids[0] == ids[2] == ids[5]  # the one debounced job in effect
    assert ids[1] == ids[4] == ids[7]
    assert ids[3] == ids[6]
    assert [r.job_id for r in results] == ids
    debounced = Job.fetch(ids[0], broker=broker)
    assert debounced.args == [5]  # the last arguments
    assert debounced.status == "scheduled"
    keys = broker.keys_for("default", ids[0])
    # its start is where the last job put it (32 s on), in the set as in the hash
    enqueued_at = int(broker.client.hget(keys.job(ids[0]), "e"))
    assert broker.client.zscore(keys.scheduled, ids[0]) == enqueued_at + 32_000
    assert int(broker.client.hget(keys.job(ids[0]), "r")) == enqueued_at + 32_000
    assert results[0].run_at_ms == enqueued_at + 32_000
    assert Job.fetch(ids[1], broker=broker).args == [1]  # throttled: the first stays
    assert Job.fetch(ids[3], broker=broker).args == [6]  # keep_last: the last waits
    assert broker.client.zcard(keys.scheduled) == 1


def test_a_call_sees_the_records_of_earlier_calls(broker: Any) -> None:
    first = broker.enqueue("default", "t.d", [0], keyed=encode(None, None, "d", "debounce", 30),
                           delay=30)
    total = broker.enqueue_many("default", [request(1, "d", "debounce", 30, delay=30),
                                            request(2, "t", "throttle", 60)])
    assert (total.enqueued, total.replaced) == (1, 1)
    assert total.job_ids[0] == first.job_id
    assert Job.fetch(first.job_id, broker=broker).args == [1]


def test_a_task_debounces_in_bulk_and_runs_once_with_the_last_arguments(spawned,
                                                                         redis_client):
    """Task.enqueue_many with a debounced dedupe key: 500 calls in 5 chunks make one
    job, which a runworker runs once with the last arguments after the window."""
    digest = keyed_tasks.digest.using(dedupe_key="digest:bulk", dedupe="debounce",
                                      dedupe_window=2)
    spawned("default", "-c", "2")
    total = digest.enqueue_many([("digest:bulk", v) for v in range(500)], chunk_size=100)
    assert (total.enqueued, total.replaced, total.chunks) == (1, 499, 5)
    assert len(set(total.job_ids)) == 1
    wait_until(lambda: redis_client.llen(RUNS), timeout=120, message="the digest sent")
    wait_until(lambda: Job.fetch(total.job_ids[0]).status == "completed", timeout=60,
               message="the job completed")
    assert [json.loads(x) for x in redis_client.lrange(RUNS, 0, -1)] == [["digest:bulk", 499]]
