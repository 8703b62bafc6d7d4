"""Bulk enqueue: per-item options, dedupe, reports, and one round trip per chunk."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError

from django_delayq import Job, JobSpec, Queue
from django_delayq.engine import Broker, BulkResult, EngineConfig, EnqueueRequest, EnqueueResult
from django_delayq.engine.bulk import Pipelined
from django_delayq.engine.keys import QueueKeys
from tests.conftest import round_trips
from tests.testapp import tasks


def test_calls_carry_their_own_options_and_fall_back_to_the_task(redis_client):
    run_at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    results: list[EnqueueResult] = []
    bulk = tasks.record.using(priority=5).enqueue_many([
        JobSpec(["a"], job_id="bulk-a", priority=50),
        JobSpec(["b"], {"extra": 1}, run_at=run_at),
        tasks.record.using(job_id="bulk-c", delay=600).bind("c"),
        ["d"],
        {"tag": "e"},
        (["f"], {"extra": 2}),
    ], results=results)
    assert (bulk.enqueued, bulk.duplicates, bulk.chunks) == (6, 0, 1)
    assert [r.status for r in results] == ["ready", "scheduled", "scheduled", "ready",
                                           "ready", "ready"]
    a = Job.fetch("bulk-a")
    assert (a.priority, a.args) == (50, ["a"])
    b = Job.fetch(bulk.job_ids[1])
    assert (b.priority, b.kwargs) == (5, {"extra": 1})
    assert dt.timedelta(0) <= b.run_at - run_at < dt.timedelta(milliseconds=1)
    c = Job.fetch("bulk-c")
    assert c.status == "scheduled"
    assert c.priority == 0


def test_duplicate_ids_are_skipped_and_reported_within_and_across_calls(redis_client):
    tasks.record.using(job_id="dup-1").enqueue("first")
    bulk = tasks.record.enqueue_many([
        JobSpec(["x"], job_id="dup-1"), JobSpec(["y"], job_id="dup-2"),
        JobSpec(["z"], job_id="dup-2"),
    ])
    assert (bulk.enqueued, bulk.duplicates) == (1, 2)
    assert bulk.duplicate_ids == ["dup-1", "dup-2"]
    assert Job.fetch("dup-1").args == ["first"]
    assert Job.fetch("dup-2").args == ["y"]
    assert Queue("default").counts()["ready"] == 2


def test_a_bad_item_stops_before_its_chunk_and_says_what_was_sent(redis_client):
    items = [JobSpec([f"ok{i}"]) for i in range(5)] + [JobSpec([], {"nope": 1})]
    with pytest.raises(TypeError, match=r"item 5: .*4 jobs of earlier chunks were enqueued"):
        tasks.record.enqueue_many(items, chunk_size=2)
    assert Queue("default").counts()["ready"] == 4
    with pytest.raises(ValueError, match="run_at or delay"):
        JobSpec(["x"], delay=1, run_at=dt.datetime.now(dt.UTC))
    with pytest.raises(TypeError, match="list or tuple"):
        JobSpec("abc")


@pytest.mark.slow
def test_one_hundred_thousand_jobs_take_one_round_trip_per_chunk(broker, redis_client):
    tasks.add.enqueue_many([[0, 0]])  # the script is loaded: no NOSCRIPT retry below
    # This process's own writes (some calls send their chunks from a thread), not the
    # server's command count: a process another test started may still be talking to
    # the same Redis.
    with round_trips(every_thread=True) as sent:
        bulk = tasks.add.enqueue_many(([i, i] for i in range(100_000)), chunk_size=1_000)
    assert len(sent) == 100 == bulk.chunks
    assert all("EVALSHA" in trip for trip in sent), sent[:3]
    assert bulk.enqueued == 100_000
    assert Queue("default").counts()["ready"] == 100_001


def test_a_bulk_call_writes_one_event_for_its_jobs_and_keeps_fifo(redis_client):
    keys = QueueKeys("dq", "default")
    bulk = tasks.record.enqueue_many([[f"j{i}"] for i in range(5)])
    entries = redis_client.xrange(keys.events)
    assert len(entries) == 1
    assert entries[0][1]["event"] == "enqueued"
    assert entries[0][1]["jobs"].split(" ") == bulk.job_ids
    assert redis_client.zrange(keys.ready, 0, -1) == bulk.job_ids  # FIFO within a priority


def test_dedupe_holds_across_slices_of_a_large_call(redis_client):
    tasks.record.using(job_id="late-dup").enqueue("first")
    jobs = [JobSpec([i], job_id=f"s{i}") for i in range(2_400)]
    jobs.append(JobSpec(["x"], job_id="late-dup"))
    bulk = tasks.record.enqueue_many(jobs, chunk_size=5_000)
    assert (bulk.chunks, bulk.enqueued, bulk.duplicates) == (1, 2_400, 1)
    assert bulk.duplicate_ids == ["late-dup"]
    assert Job.fetch("late-dup").args == ["first"]
    assert Queue("default").counts()["ready"] == 2_401


def test_the_earliest_delayed_job_of_a_bulk_call_wakes_a_worker(redis_client):
    keys = QueueKeys("dq", "default")
    tasks.record.using(delay=600).enqueue("later")
    redis_client.delete(keys.marker)
    results: list[EnqueueResult] = []
    bulk = tasks.record.enqueue_many([JobSpec([1], delay=900), JobSpec([2], delay=60),
                                      JobSpec([3], delay=300)], results=results)
    assert bulk.enqueued == 3
    earliest = min(r.run_at_ms for r in results)
    assert redis_client.zrange(keys.marker, 0, -1, withscores=True) == [("1", earliest)]


def test_a_sharded_queue_reports_its_jobs_in_call_order(settings):
    """Each shard answers its own call: the ids and results still follow the requests."""
    from django_delayq.connection import get_broker
    from django_delayq.engine import EnqueueRequest

    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"wide": {"shards": 3}}}
    broker = get_broker()
    ids = [f"w{i}" for i in range(30)]
    assert len({broker.keys_for("wide", job_id) for job_id in ids}) == 3
    tasks.record.using(queue="wide", job_id="w7").enqueue("there first")
    results: list[EnqueueResult] = []
    total = broker.enqueue_many("wide", [EnqueueRequest(task=tasks.record.name, args=[j],
                                                        job_id=j) for j in ids],
                                results=results)
    assert total.job_ids == ids
    assert [r.job_id for r in results] == ids
    assert [r.added for r in results] == [job_id != "w7" for job_id in ids]
    assert total.duplicate_ids == ["w7"]


def requests_calling(action: Callable[[], Any], at: int, n: int,
                     ) -> Iterator[EnqueueRequest]:
    """``n`` jobs' requests (ids ``p0``, ``p1``, ...), calling ``action`` as the one ``at``
    is encoded: the chunks before it are then sent, the last of them maybe unanswered."""
    for i in range(n):
        if i == at:
            action()
        yield EnqueueRequest(task="tests.testapp.tasks.record", args=[i], job_id=f"p{i}")


def spy_on_sending_again(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of chunks each time a pipelined call sends its chunks in flight again."""
    sent_again: list[int] = []
    send_again = Pipelined._send_again

    def spied(self: Pipelined, chunks: list[Any]) -> None:
        sent_again.append(len(chunks))
        send_again(self, chunks)

    monkeypatch.setattr(Pipelined, "_send_again", spied)
    return sent_again


def test_chunks_sent_before_the_last_is_answered_keep_fifo_and_count_every_reply(
        broker, redis_client):
    keys = QueueKeys("dq", "default")
    existing = [f"p{i}" for i in range(0, 3_000, 60)]  # a duplicate in every chunk of 100
    broker.enqueue_many("default", [EnqueueRequest(task="t.x", args=[], job_id=job_id)
                                    for job_id in existing])
    for _ in range(3):  # the connection each call holds is given back in step
        bulk = broker.enqueue_many("default", requests_calling(lambda: None, 0, 3_000),
                                   chunk_size=100)
        new = [f"p{i}" for i in range(3_000) if f"p{i}" not in existing]
        assert (bulk.chunks, bulk.enqueued, bulk.duplicates) == (30, len(new), len(existing))
        assert bulk.duplicate_ids == existing
        assert redis_client.zrange(keys.ready, 0, -1) == existing + new  # FIFO
        redis_client.delete(*(keys.job(job_id) for job_id in new))
        redis_client.zrem(keys.ready, *new)


def test_a_connection_lost_with_chunks_in_flight_adds_each_job_once(broker, redis_client,
                                                                    monkeypatch):
    """The server closes every connection mid-call: the chunks not yet answered are sent
    again with the same ids, so each job is added once and FIFO holds."""
    keys = QueueKeys("dq", "default")
    observer = redis.Redis.from_url(os.environ["DELAYQ_TEST_REDIS_URL"])
    sent_again = spy_on_sending_again(monkeypatch)
    for at in (250, 1_050, 1_999):
        redis_client.flushdb()
        sent_again.clear()
        bulk = broker.enqueue_many("default", requests_calling(
            lambda: observer.client_kill_filter(_type="normal", skipme=True), at, 2_000),
            chunk_size=100)
        assert sent_again  # the lost connection was found with a chunk in flight
        ids = [f"p{i}" for i in range(2_000)]
        assert bulk.job_ids == ids
        assert bulk.enqueued + bulk.duplicates == 2_000  # a lost reply's jobs: duplicates
        assert redis_client.zrange(keys.ready, 0, -1) == ids
    observer.close()


def test_a_refused_chunk_stops_the_call_with_the_chunk_sent_behind_it_counted(
        broker, redis_client):
    """Redis refuses one chunk (a job key holds a string): the call raises that error and
    sends nothing more, and its totals count the chunk written before the refusal was
    read, which Redis ran."""
    keys = QueueKeys("dq", "default")
    redis_client.set(keys.job("p1050"), "not a job")
    total = BulkResult()
    with pytest.raises(ResponseError, match="WRONGTYPE"):
        broker.enqueue_many("default", requests_calling(lambda: None, 0, 3_000),
                            chunk_size=100, total=total)
    stored = [f"p{i}" for i in [*range(1_000), *range(1_100, 1_200)]]
    assert redis_client.zrange(keys.ready, 0, -1) == stored
    assert (total.enqueued, total.chunks) == (1_100, 12)  # chunk 10 refused, 11 ran
    assert total.job_ids == stored


def test_a_health_check_never_reads_the_reply_of_a_chunk_in_flight():
    """A client whose connections check their health before every command (a PING when
    idle past ``health_check_interval``): the check is skipped while a chunk's reply is
    due, or its PING would read that reply."""
    client = redis.Redis.from_url(os.environ["DELAYQ_TEST_REDIS_URL"],
                                  health_check_interval=1e-6, decode_responses=True)
    client.flushdb()
    broker = Broker(client, EngineConfig())
    results: list[EnqueueResult] = []
    bulk = broker.enqueue_many("default", requests_calling(lambda: None, 0, 3_000),
                               chunk_size=100, results=results)
    assert (bulk.enqueued, bulk.duplicates, bulk.chunks) == (3_000, 0, 30)
    assert [r.job_id for r in results] == [f"p{i}" for i in range(3_000)]
    assert {r.status for r in results} == {"ready"}
    assert client.zcard(QueueKeys("dq", "default").ready) == 3_000
    client.close()


def test_a_connection_closed_under_the_call_and_opened_again_loses_no_reply(
        broker, redis_client, monkeypatch):
    """Another thread's ``pool.disconnect()`` (a failover's) closes the connection a call
    holds: its next write finds the socket closed and sends the chunks in flight again.
    Written on a socket redis-py opened again, the next chunk's reply would be read as
    the reply due on the old one."""
    keys = QueueKeys("dq", "default")
    sent_again = spy_on_sending_again(monkeypatch)
    results: list[EnqueueResult] = []
    bulk = broker.enqueue_many("default", requests_calling(
        broker.client.connection_pool.disconnect, 1_050, 2_000), chunk_size=100,
        results=results)
    assert sent_again == [2]  # the chunk in flight and the one written after it
    ids = [f"p{i}" for i in range(2_000)]
    assert bulk.job_ids == [r.job_id for r in results] == ids
    assert bulk.enqueued + bulk.duplicates == 2_000
    assert redis_client.zrange(keys.ready, 0, -1) == ids


def test_a_call_pipelines_until_its_first_waiting_job_then_sends_one_chunk_at_a_time(
        broker, redis_client):
    """Plain chunks go pipelined; from the first chunk holding a job that waits for
    parents (here for jobs of the chunks before it), each chunk is answered before the
    next is sent: every waiting job finds its parent stored."""
    keys = QueueKeys("dq", "default")
    requests = [EnqueueRequest(task="t.x", args=[i], job_id=f"p{i}") for i in range(250)]
    requests += [EnqueueRequest(task="t.x", args=[i], job_id=f"w{i}",
                                depends_on=[("default", f"p{i}")]) for i in range(250)]
    requests += [EnqueueRequest(task="t.x", args=[i], job_id=f"q{i}") for i in range(250)]
    results: list[EnqueueResult] = []
    bulk = broker.enqueue_many("default", requests, chunk_size=100, results=results)
    assert (bulk.enqueued, bulk.chunks) == (750, 8)
    assert [r.job_id for r in results] == [r.job_id for r in requests]
    assert [r.status for r in results] == ["ready"] * 250 + ["waiting"] * 250 + ["ready"] * 250
    assert redis_client.zcard(keys.waiting) == 250
    assert redis_client.zrange(keys.ready, 0, -1) == (
        [f"p{i}" for i in range(250)] + [f"q{i}" for i in range(250)])
