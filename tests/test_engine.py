"""The engine over a real Redis: ordering, scheduling, dedupe, leases and state changes."""

from __future__ import annotations

import datetime as dt
import random
import re
from pathlib import Path

import pytest

from django_delayq.engine import (
    STATUSES,
    Broker,
    EncodedJob,
    EngineConfig,
    EnqueueRequest,
    InvalidJobState,
    Job,
    JobNotFound,
    Queue,
    fields,
)
from django_delayq.engine.fields import ATTEMPT_LOG_SIZE, DEFAULTS, LOGICAL, STORED, stored
from django_delayq.engine.jobhash import with_completed_attempt
from django_delayq.engine.keys import QueueKeys
from tests.conftest import round_trips


@pytest.fixture
def bare(redis_client) -> Broker:
    """An engine broker with no Django settings behind it."""
    return Broker(redis_client, EngineConfig(prefix="t"))


def claim_all(broker: Broker, queue: str, batch: int = 100) -> list:
    jobs = []
    while True:
        (result,) = broker.claim(queue, batch, "w")
        if not result.jobs:
            return jobs
        jobs += result.jobs


def test_priority_order_then_fifo_over_thousands_of_jobs(bare):
    rng = random.Random(7)
    requests = [EnqueueRequest(task="t.x", args=[i], priority=rng.choice([-100, -5, 0, 7, 100]))
                for i in range(5000)]
    bare.enqueue_many("q", requests, chunk_size=700)
    claimed = claim_all(bare, "q", batch=333)
    assert len(claimed) == 5000
    expected = sorted(range(5000), key=lambda i: (-requests[i].priority, i))
    assert [int(j.args_json[1:-1]) for j in claimed] == expected


def test_single_enqueues_keep_fifo_within_a_priority(bare):
    ids = [bare.enqueue("q", "t.x", [i], priority=3).job_id for i in range(300)]
    assert [j.id for j in claim_all(bare, "q", batch=50)] == ids


def test_delayed_job_is_not_claimed_before_its_run_at(bare, redis_client):
    res = bare.enqueue("q", "t.x", delay=0.3)
    assert res.status == "scheduled"
    assert res.run_at_ms - res.enqueued_at_ms == 300
    (first,) = bare.claim("q", 10, "w")
    assert first.jobs == []
    assert first.next_due_ms == res.run_at_ms
    while True:
        (result,) = bare.claim("q", 10, "w")
        if result.jobs:
            break
        assert result.now_ms < res.run_at_ms, "due job not claimed"
    assert result.jobs[0].started_at_ms >= res.run_at_ms
    assert result.now_ms >= res.run_at_ms


def test_a_claim_times_the_wait_for_the_next_due_job_to_the_microsecond(bare, redis_client):
    """The wait a claim gives is the time to the next run_at from the server clock's
    microsecond, not from its millisecond (which would wake a worker up to 1 ms late)."""

    def server_us() -> int:
        seconds, micros = redis_client.time()
        return int(seconds) * 1_000_000 + int(micros)

    res = bare.enqueue("q", "t.x", delay=5)
    for _ in range(50):
        before = server_us()
        (result,) = bare.claim("q", 10, "w")
        after = server_us()
        assert result.jobs == []
        assert result.next_due_ms == res.run_at_ms
        assert result.due_in_us is not None
        due_us = res.run_at_ms * 1000
        assert due_us - after <= result.due_in_us <= due_us - before
        assert result.due_in_us > (res.run_at_ms - result.now_ms - 1) * 1000
    assert Job.fetch(res.job_id, "q", broker=bare).cancel() is True
    (result,) = bare.claim("q", 10, "w")
    assert (result.next_due_ms, result.due_in_us) == (None, None)


def test_past_run_at_is_ready_at_once(bare):
    res = bare.enqueue("q", "t.x", run_at=dt.datetime(2001, 1, 1, tzinfo=dt.UTC))
    assert res.status == "ready"
    assert len(claim_all(bare, "q")) == 1


def test_job_id_dedupe(bare):
    first = bare.enqueue("q", "t.x", [1], job_id="receipt-42", delay=60)
    again = bare.enqueue("q", "t.x", [2], job_id="receipt-42")
    assert first.added
    assert not again.added
    assert again.status == "scheduled"
    assert again.run_at_ms == first.run_at_ms
    assert Queue("q", broker=bare).counts()["scheduled"] == 1
    bulk = bare.enqueue_many("q", [EnqueueRequest(task="t.x", job_id="receipt-42"),
                                   EnqueueRequest(task="t.x", job_id="receipt-43")])
    assert (bulk.enqueued, bulk.duplicates) == (1, 1)


def test_cancel_only_before_start(bare):
    scheduled = Job.fetch(bare.enqueue("q", "t.x", delay=60).job_id, "q", broker=bare)
    assert scheduled.cancel() is True
    assert scheduled.refresh().status == "cancelled"
    running_id = bare.enqueue("q", "t.x").job_id
    claim_all(bare, "q")
    running = Job.fetch(running_id, "q", broker=bare)
    assert running.cancel() is False
    assert running.refresh().status == "claimed"  # leased; active once a thread starts it
    counts = Queue("q", broker=bare).counts()
    assert (counts["cancelled"], counts["active"], counts["scheduled"]) == (1, 1, 0)
    with pytest.raises(JobNotFound):
        Job(id="nope", queue="q", broker=bare).cancel()


def test_a_waiting_job_hash_holds_short_names_and_no_defaults(bare, redis_client):
    """A waiting job is mostly its hash: short field names, no field at its default."""
    run_at = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(hours=1)
    (job_id,) = bare.enqueue_many("q", [EnqueueRequest(
        task="app.tasks.late", args=[1234567890123456], run_at=run_at)]).job_ids
    raw = redis_client.hgetall(QueueKeys("t", "q").job(job_id))
    assert set(raw) == {stored(name) for name in
                        ("task", "args", "enqueued_at", "run_at", "status")}
    assert all(len(name) <= 2 for name in raw)
    job = Job.fetch(job_id, "q", broker=bare)
    assert (job.task_name, job.status, job.args, job.kwargs, job.priority) == (
        "app.tasks.late", "scheduled", [1234567890123456], {}, 0)
    assert (job.attempts, job.max_attempts, job.run_at) == (0, 1, run_at)
    assert job.enqueued_at == dt.datetime.fromtimestamp(int(raw[stored("enqueued_at")]) / 1000,
                                                        tz=dt.UTC)
    (listed,) = Queue("q", broker=bare).jobs("scheduled")
    assert (listed.id, listed.task_name, listed.args, listed.run_at) == (
        job_id, "app.tasks.late", [1234567890123456], run_at)


def test_a_job_to_run_at_once_stores_no_run_at_and_reads_its_enqueued_at(bare, redis_client):
    res = bare.enqueue("q", "app.tasks.now", [1])
    raw = redis_client.hgetall(QueueKeys("t", "q").job(res.job_id))
    assert set(raw) == {stored(name) for name in ("task", "args", "enqueued_at", "seq",
                                                  "status")}
    assert res.run_at_ms == res.enqueued_at_ms
    job = Job.fetch(res.job_id, "q", broker=bare)
    assert job.run_at == job.enqueued_at == dt.datetime.fromtimestamp(
        res.enqueued_at_ms / 1000, tz=dt.UTC)
    again = bare.enqueue("q", "app.tasks.now", [1], job_id=res.job_id)  # the duplicate's reply
    assert (again.added, again.run_at_ms) == (False, res.enqueued_at_ms)
    (claimed,) = claim_all(bare, "q")
    assert claimed.run_at_ms == res.enqueued_at_ms


def test_an_encoded_job_names_the_enqueue_scripts_values_and_is_what_it_stores(
        bare, redis_client):
    job = bare.encode_request(EnqueueRequest(task="t.x", args=[1], kwargs={"k": "v"},
                                             delay=2, job_id="j1", priority=4,
                                             max_attempts=5, timeout=3))
    assert type(job) is EncodedJob
    assert job == EncodedJob(job_id="j1", task="t.x", args_json="[1]",
                             kwargs_json='{"k":"v"}', priority=4, run_at_ms="",
                             delay_ms=2000, max_attempts=5, timeout_ms=3000)
    (keys,) = bare.shards("q")
    (added, status, run_at_ms, enqueued_at_ms) = bare.commands.enqueue(keys, [job])
    assert (added, status, int(run_at_ms) - int(enqueued_at_ms)) == (1, "scheduled", 2000)
    stored_job = redis_client.hgetall(keys.job("j1"))
    assert {name: stored_job[stored(name)] for name in
            ("task", "args", "kwargs", "priority", "max_attempts", "timeout")} == {
        "task": "t.x", "args": "[1]", "kwargs": '{"k":"v"}', "priority": "4",
        "max_attempts": "5", "timeout": "3000"}


def test_every_field_is_stored_short_and_read_back_by_its_name(bare, redis_client):
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    job_id = bare.enqueue("q", "t.x", [1], {"k": "v"}, priority=5, max_attempts=3,
                          timeout=5, traceparent=traceparent).job_id
    keys = QueueKeys("t", "q")
    (c,) = claim_all(bare, "q")
    assert c.traceparent == traceparent
    batch = bare.batch()
    bare.add_fail(batch, keys, job_id, c.attempt, "ValueError: one", "tb one", 3_600_000,
                  c.started_at_ms)
    batch.run()
    raw = redis_client.hgetall(keys.job(job_id))
    # Not written by this run: the result (it failed) and progress (only a task sets it).
    # Nor parents (it has none), nor aborted_by (nobody aborted it), nor a concurrency key
    # or its weight (test_keyed*.py), nor the format (format 1 stores none).
    assert set(raw) == set(STORED.values()) - {
        stored("result"), stored("progress"), stored("progress_message"), stored("parents"),
        stored("parent_policy"), stored("parent_results"), stored("linked"),
        stored("aborted_by"), stored("concurrency_key"), stored("concurrency_limit"),
        stored("waiting_for_slot"), stored("key_weight"), stored("key_rate_limit"),
        stored("key_rate_period"), stored("format")}
    job = Job.fetch(job_id, "q", broker=bare)
    assert (job.task_name, job.status, job.args, job.kwargs, job.priority) == (
        "t.x", "scheduled", [1], {"k": "v"}, 5)
    assert (job.attempts, job.max_attempts, job.worker) == (1, 3, "w")
    assert (job.error, job.traceback) == ("ValueError: one", "tb one")
    assert None not in (job.started_at, job.finished_at, job.enqueued_at, job.run_at)
    assert job.timeout == 5.0
    assert [(e["attempt"], e["worker"], e["outcome"], e["error"]) for e in job.attempt_log] == [
        (1, "w", "retried", "ValueError: one")]
    assert job.attempt_log[0]["started_at"] == job.started_at
    assert job.attempt_log[0]["finished_at"] == job.finished_at
    assert set(LOGICAL) == set(STORED.values()), "one stored name per field"


def test_the_attempt_that_completed_a_job_is_read_from_its_hash_once():
    """A completed attempt is not written to the log: readers add it from the hash's
    fields, unless the log holds it already (written by an earlier release)."""
    text = {"status": "completed", "attempts": "3", "worker": "w", "started_at": "5",
            "finished_at": "9"}
    entry = {"n": 3, "w": "w", "b": 5, "f": 9, "o": "completed"}
    retried = [{"n": n, "w": "w", "b": 1, "f": 2, "o": "retried"} for n in (1, 2)]
    assert with_completed_attempt([], text) == [entry]
    assert with_completed_attempt(retried, text) == [*retried, entry]
    assert with_completed_attempt([*retried, entry], text) == [*retried, entry]
    # Failed at attempt 3, retried by hand (up to 0.1.0 the count started again),
    # completed at 3.
    failed = {"n": 3, "w": "v", "b": 1, "f": 2, "o": "failed", "t": "Traceback"}
    assert with_completed_attempt([*retried, failed], text) == [*retried, failed, entry]
    full = [{"n": n, "o": "retried"} for n in range(ATTEMPT_LOG_SIZE)]
    assert with_completed_attempt(full, text) == [*full[1:], entry]  # still the last 25
    for status in ("failed", "cancelled", "active", "ready"):
        assert with_completed_attempt(retried, {**text, "status": status}) == retried
    assert with_completed_attempt("damaged", text) == "damaged"


LUA = Path(fields.__file__).resolve().parent.parent / "lua"
#: A Redis command on a job's hash in a Lua script, the hash named as the scripts name

#: it, and the arguments up to the first closing parenthesis.
HASH_CALL = re.compile(r"'(HSET|HSETNX|HGET|HMGET|HDEL|HEXISTS|HINCRBY)',\s*"
                       r"(?:job_key|prev_key|job_prefix \.\. [\w\[\] +]+?|KEYS\[5 \+ i\]),"
                       r"([^)]*)\)")
#: A field appended to the list a new job's hash is written from (lua/enqueue.lua).
NEW_FIELD = re.compile(r"fields\[#fields \+ 1\] = '(\w+)'")


def script_fields() -> dict[str, set[str]]:
    """Each field of a job hash the Lua scripts read or write -> the scripts that do."""
    found: dict[str, set[str]] = {}
    for path in sorted(LUA.rglob("*.lua")):
        text = path.read_text()
        names = NEW_FIELD.findall(text)
        for command, args in HASH_CALL.findall(text):
            parts = [part.strip() for part in args.split(",")]
            if command in ("HSET", "HSETNX"):
                parts = parts[::2]  # field, value, field, value...
            elif command == "HINCRBY":
                parts = parts[:1]
            names += [part.strip("'") for part in parts if re.fullmatch(r"'\w+'", part)]
        for name in names:
            found.setdefault(name, set()).add(path.relative_to(LUA).as_posix())
    return found


def test_the_field_table_names_every_field_the_scripts_use():
    """engine/fields.py is the one list of a job hash's fields: each field a script reads
    or writes has its row (and its logical name), and each row is used by a script or is
    the format version, which no script of format 1 writes."""
    used = script_fields()
    assert {"t", "s", "kr", "kp", "dp", "tp"} <= set(used), used  # the scan finds them
    assert {name: scripts for name, scripts in used.items()
            if name not in LOGICAL} == {}
    assert set(LOGICAL) - set(used) == {stored("format")}
    documented = set(re.findall(r"``(\w+)``  ", fields.__doc__ or ""))
    assert set(LOGICAL) <= documented, set(LOGICAL) - documented


def test_defaults_are_dropped_when_a_field_returns_to_them(bare, redis_client):

    keys = QueueKeys("t", "q")
    job_id = bare.enqueue("q", "t.x", priority=5).job_id
    job = Job.fetch(job_id, "q", broker=bare)
    job.reschedule(delay=0, priority=0)
    assert stored("priority") not in redis_client.hgetall(keys.job(job_id))
    (c,) = claim_all(bare, "q")
    batch = bare.batch()
    bare.add_release(batch, keys, [(job_id, c.attempt)], started=False)
    batch.run()
    assert stored("attempts") not in redis_client.hgetall(keys.job(job_id))
    (c,) = claim_all(bare, "q")
    assert c.attempt == 1
    batch = bare.batch()
    bare.add_fail(batch, keys, job_id, c.attempt, "E: x", "", 0)
    assert batch.run()[0][0] == "failed", "max_attempts absent is 1: no retry"
    job.retry()
    raw = redis_client.hgetall(keys.job(job_id))
    assert set(raw) & {stored(name) for name in DEFAULTS} == {stored("attempts"),
                                                             stored("max_attempts")}
    assert (job.refresh().attempts, job.max_attempts, job.priority) == (1, 2, 0)


def test_reschedule_moves_between_scheduled_and_ready(bare):
    job = Job.fetch(bare.enqueue("q", "t.x", delay=3600).job_id, "q", broker=bare)
    job.reschedule(delay=0)
    assert job.refresh().status == "ready"
    job.reschedule(run_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=2), priority=50)
    job.refresh()
    assert job.status == "scheduled"
    assert job.priority == 50
    assert job.run_at > dt.datetime.now(dt.UTC) + dt.timedelta(minutes=119)
    claimed = claim_all(bare, "q")
    assert claimed == []
    job.reschedule(delay=0)
    (claimed,) = claim_all(bare, "q")
    assert claimed.priority == 50
    with pytest.raises(InvalidJobState):
        job.reschedule(delay=5)


def test_fail_retries_then_dead_letters_and_retry_revives(bare):
    job_id = bare.enqueue("q", "t.x", max_attempts=2).job_id
    keys = QueueKeys("t", "q")
    (c,) = claim_all(bare, "q")
    batch = bare.batch()
    bare.add_fail(batch, keys, job_id, c.attempt, "ValueError: one", "tb one", 0)
    assert batch.run() == [["retried", pytest.approx(c.started_at_ms, abs=1000)]]
    (c2,) = claim_all(bare, "q")
    assert c2.attempt == 2
    batch = bare.batch()
    bare.add_fail(batch, keys, job_id, c2.attempt, "ValueError: two", "tb two", 0)
    assert batch.run()[0][0] == "failed"
    job = Job.fetch(job_id, "q", broker=bare)
    assert (job.status, job.attempts, job.error, job.traceback) == (
        "failed", 2, "ValueError: two", "tb two")
    assert Queue("q", broker=bare).counts()["failed"] == 1
    job.retry()
    assert (job.attempts, job.max_attempts) == (2, 4)  # a fresh budget of 2 attempts
    assert (job.refresh().status, job.attempts, job.max_attempts) == ("ready", 2, 4)
    assert job.error is None
    assert Queue("q", broker=bare).counts()["failed"] == 0
    (c3,) = claim_all(bare, "q")  # the count goes on: attempt 3
    assert c3.attempt == 3
    batch = bare.batch()
    bare.add_complete(batch, keys, [(job_id, c3.attempt, '"done"')])
    assert batch.run() == [[1]]
    assert [(e["attempt"], e["outcome"]) for e in job.refresh().attempt_log] == [
        (1, "retried"), (2, "failed"), (3, "completed")]


def test_a_lapsed_lease_cannot_end_a_run_retried_by_hand(bare):
    """A worker whose lease lapsed (frozen, partitioned) still holds its attempt
    number. After the job was dead-lettered and retried by hand, the new run's attempt
    must differ from it, or that worker's late ack would complete or fail the new run
    while it is still running."""
    keys = QueueKeys("t", "q")
    for end in ("complete", "fail"):
        job_id = bare.enqueue("q", "t.x", max_attempts=1).job_id
        (stale,) = claim_all(bare, "q")
        bare.client.zadd(keys.active, {job_id: 0})  # its lease lapses
        assert bare.reclaim("q") == (0, 1)
        job = Job.fetch(job_id, "q", broker=bare).retry()
        (fresh,) = claim_all(bare, "q")
        batch = bare.batch()
        if end == "complete":
            bare.add_complete(batch, keys, [(job_id, stale.attempt, '"late"')])
            assert batch.run() == [[0]], "the late ack is stale"
        else:
            bare.add_fail(batch, keys, job_id, stale.attempt, "E: late", "", 0)
            assert batch.run()[0][0] == "stale"
        assert (job.refresh().status, job.result) == ("claimed", None)
        batch = bare.batch()
        bare.add_complete(batch, keys, [(job_id, fresh.attempt, '"fresh"')])
        assert batch.run() == [[1]]
        assert (job.refresh().status, job.result) == ("completed", "fresh")


def test_late_ack_of_a_reclaimed_job_changes_nothing(bare):
    cfg = EngineConfig(prefix="t", lease_ms=1)
    short = Broker(bare.client, cfg)
    job_id = short.enqueue("q", "t.x", max_attempts=2).job_id
    (first,) = claim_all(short, "q")
    keys = QueueKeys("t", "q")
    while short.reclaim("q") == (0, 0):
        pass
    (second,) = claim_all(bare, "q")
    assert second.attempt == first.attempt + 1
    batch = bare.batch()
    bare.add_complete(batch, keys, [(job_id, first.attempt, '"late"')])
    bare.add_fail(batch, keys, job_id, first.attempt, "E: late", "", -1)
    assert batch.run() == [[0], ["stale", 0]]
    assert Job.fetch(job_id, "q", broker=bare).status == "claimed"
    batch = bare.batch()
    bare.add_complete(batch, keys, [(job_id, second.attempt, '"fresh"')])
    assert batch.run() == [[1]]
    job = Job.fetch(job_id, "q", broker=bare)
    assert (job.status, job.result) == ("completed", "fresh")


def test_reclaim_dead_letters_a_job_out_of_attempts(bare):
    short = Broker(bare.client, EngineConfig(prefix="t", lease_ms=1))
    job_id = short.enqueue("q", "t.x", max_attempts=1).job_id
    claim_all(short, "q")
    while short.reclaim("q") == (0, 0):
        pass
    job = Job.fetch(job_id, "q", broker=bare)
    assert job.status == "failed"
    assert "LeaseExpired" in job.error


def test_a_reclaimed_attempt_counts_as_retried(bare, redis_client):
    short = Broker(bare.client, EngineConfig(prefix="t", lease_ms=1))
    short.enqueue("q", "t.x", max_attempts=2)
    claim_all(short, "q")
    while short.reclaim("q") == (0, 0):
        pass
    assert redis_client.hget(QueueKeys("t", "q").stats, "r") == "1"


@pytest.mark.parametrize("started", [True, False])
def test_a_job_whose_abort_was_asked_ends_cancelled_when_its_lease_lapses(
        bare, redis_client, started):
    """Its worker died before it heard of the abort: the job is not run again (its
    attempts left notwithstanding), it ends cancelled, as its attempt's end would."""
    short = Broker(bare.client, EngineConfig(prefix="t", lease_ms=1))
    job_id = short.enqueue("q", "t.x", max_attempts=3).job_id
    (claimed,) = claim_all(short, "q")
    keys = QueueKeys("t", "q")
    if started:
        batch = short.batch()
        short.add_start(batch, keys, "w", [(job_id, claimed.attempt, 1)])
        batch.run()
    assert Job.fetch(job_id, "q", broker=bare).abort("admin")
    if started:
        while Job.fetch(job_id, "q", broker=bare).status != "cancelled":
            assert short.reclaim("q") == (0, 0), "neither run again nor failed"
    else:  # its host saw its process end and hands its jobs back
        short.reclaim_worker("w", [keys])
    job = Job.fetch(job_id, "q", broker=bare)
    assert job.status == "cancelled"
    assert job.error.startswith("JobAborted: aborted by admin")
    assert job.attempts == (1 if started else 0)
    assert claim_all(bare, "q") == []


def test_extend_keeps_the_lease_and_reports_lost_ones(bare, redis_client):
    job_id = bare.enqueue("q", "t.x").job_id
    (c,) = claim_all(bare, "q")
    keys = QueueKeys("t", "q")
    before = redis_client.zscore(keys.active, job_id)
    batch = bare.batch()
    bare.add_extend(batch, keys, [(job_id, c.attempt), ("ghost", 1)], 120_000)
    assert batch.run() == [[["ghost"], []]]
    assert redis_client.zscore(keys.active, job_id) > before + 60_000


def test_release_hands_back_without_counting_the_attempt(bare):
    ids = [bare.enqueue("q", "t.x", [i]).job_id for i in range(3)]
    claimed = claim_all(bare, "q")
    batch = bare.batch()
    bare.add_release(batch, QueueKeys("t", "q"), [(j.id, j.attempt) for j in claimed],
                     started=False)
    assert batch.run() == [3]
    again = claim_all(bare, "q")
    assert [j.id for j in again] == ids
    assert [j.attempt for j in again] == [1, 1, 1]


def test_a_job_whose_abort_was_asked_is_not_handed_back_to_run_again(bare, redis_client):
    """A stopping worker hands back what it holds; a job whose abort was asked meanwhile
    must end cancelled, started or not, never run again."""
    keys = QueueKeys("t", "q")
    for started in (False, True):
        kept, aborted = (bare.enqueue("q", "t.x", [i]).job_id for i in range(2))
        claimed = claim_all(bare, "q")
        assert Job.fetch(aborted, "q", broker=bare).abort(by="ops") is True
        batch = bare.batch()
        bare.add_release(batch, keys, [(j.id, j.attempt) for j in claimed], started=started)
        assert batch.run() == [1]
        assert redis_client.zrange(keys.ready, 0, -1) == [kept]
        assert bare.reclaim("q") == (0, 0)  # ended cancelled: neither returned nor failed
        job = Job.fetch(aborted, "q", broker=bare)
        assert (job.status, job.aborted_by) == ("cancelled", "ops")
        assert job.attempts == 0  # its start was never noted: no attempt counted
        (again,) = claim_all(bare, "q")
        assert again.id == kept
        batch = bare.batch()
        bare.add_complete(batch, keys, [(kept, again.attempt, "null")])
        assert batch.run() == [[1]]


def test_paused_queue_accepts_but_does_not_hand_out(bare):
    queue = Queue("q", broker=bare)
    queue.pause()
    assert queue.is_paused
    bare.enqueue("q", "t.x")
    (result,) = bare.claim("q", 10, "w")
    assert result.paused
    assert result.jobs == []
    queue.resume()
    assert len(claim_all(bare, "q")) == 1


def test_orphan_ids_are_dropped_not_crashed_on(bare, redis_client):
    keys = QueueKeys("t", "q")
    redis_client.zadd(keys.ready, {"ghost": 1})
    redis_client.zadd(keys.scheduled, {"ghost2": 1})
    good = bare.enqueue("q", "t.x").job_id
    (result,) = bare.claim("q", 10, "w")
    assert [j.id for j in result.jobs] == [good]
    assert result.orphans == 2


def test_purge_and_listing(bare):
    for i in range(5):
        bare.enqueue("q", "t.x", [i], delay=60 + i)
    queue = Queue("q", broker=bare)
    listed = queue.jobs("scheduled", offset=1, limit=2)
    assert [j.args for j in listed] == [[1], [2]]
    assert queue.next_due() == queue.jobs("scheduled", limit=1)[0].run_at
    assert queue.purge() == 5
    assert sum(queue.counts().values()) == 0


def test_purge_leaves_a_job_that_took_a_finished_jobs_id_alone(bare, redis_client):
    """A finished job's record may expire before its id leaves the finished set; a new
    job enqueued with that id, then running, is not the finished one a purge deletes."""
    bare.enqueue("q", "t.x", [1], job_id="again")
    (first,) = claim_all(bare, "q")
    keys = bare.keys_for("q", "again")
    batch = bare.batch()
    bare.add_complete(batch, keys, [(first.id, first.attempt, "1")])
    batch.run()
    redis_client.delete(keys.job("again"))  # its RESULT_TTL ran out; its id waits for a trim
    assert bare.enqueue("q", "t.x", [2], job_id="again").added
    (running,) = claim_all(bare, "q")
    queue = Queue("q", broker=bare)
    queue.purge(("completed",))
    assert Job.fetch("again", queue="q", broker=bare).status == "claimed"
    batch = bare.batch()
    bare.add_complete(batch, keys, [(running.id, running.attempt, "2")])
    (acked,) = batch.run()
    assert list(acked) == [1], "the running job's ack lands"
    assert Job.fetch("again", queue="q", broker=bare).result == 2


def test_position_counts_jobs_ahead(bare):
    ids = [bare.enqueue("q", "t.x", [i]).job_id for i in range(4)]
    later = bare.enqueue("q", "t.x", delay=30).job_id
    assert Job(id=ids[2], queue="q", broker=bare).position() == 2
    assert Job(id=later, queue="q", broker=bare).position() == 4


def test_redis_time_decides_not_the_client_clock(bare, monkeypatch):
    """Even with this process's clock a day ahead, a delayed job waits for Redis time."""
    import time as time_module

    real = time_module.time
    monkeypatch.setattr(time_module, "time", lambda: real() + 86_400)
    res = bare.enqueue("q", "t.x", delay=0.2)
    (result,) = bare.claim("q", 10, "w")
    assert result.jobs == []
    assert res.run_at_ms - result.now_ms > 100


class CountingConnection:
    """Counts what a redis-py connection sends: one send is one round trip."""

    sends = 0

    @classmethod
    def make(cls):
        import redis

        class Counting(redis.Connection):
            def send_packed_command(self, command, check_health=True):
                cls.sends += 1
                return super().send_packed_command(command, check_health)

        return Counting


def test_round_trips_enqueue_claim_and_ack(redis_client):
    import redis

    kwargs = redis_client.connection_pool.connection_kwargs
    counting = CountingConnection.make()
    pool = redis.ConnectionPool(connection_class=counting, **kwargs)
    broker = Broker(redis.Redis(connection_pool=pool), EngineConfig(prefix="rt"))
    broker.enqueue("q", "t.x")  # first use: loads the script, registers the queue
    # and connects: script calls hold their own connection, pipelines take the pool's
    broker.client.ping()

    def trips(action):
        before = CountingConnection.sends
        action()
        return CountingConnection.sends - before

    assert trips(lambda: broker.enqueue("q", "t.x", [1])) == 1
    requests = [EnqueueRequest(task="t.x", args=[i]) for i in range(5000)]
    with round_trips(every_thread=True) as sent:  # pipelined chunks are writes too
        broker.enqueue_many("q", requests, chunk_size=1000)
    assert len(sent) == 5
    claimed = []
    assert trips(lambda: claimed.extend(broker.claim("q", 500, "w")[0].jobs)) == 1
    assert len(claimed) == 500
    keys = QueueKeys("rt", "q")

    def ack():
        batch = broker.batch()
        broker.add_complete(batch, keys, [(j.id, j.attempt, "null") for j in claimed])
        assert batch.run() == [[1] * 500]

    assert trips(ack) == 1


def test_status_groups_cover_the_lifecycle_once():
    from django_delayq.engine.status import (
        CANCELLABLE,
        FINISHED,
        JOB_STATUSES,
        PENDING,
        PURGEABLE,
        RETRYABLE,
        Status,
    )
    from django_delayq.models import JobStatus

    leased = (Status.CLAIMED, Status.ACTIVE)  # in the active set, under a lease
    # a waiting job (depends_on) comes first: it is not scheduled until its parents end
    assert (Status.WAITING, *PENDING, *leased, *FINISHED) == tuple(Status) == JOB_STATUSES
    assert (Status.WAITING, *PENDING) == CANCELLABLE
    # claimed jobs are in the active set: no set of their own
    assert tuple(s for s in JOB_STATUSES if s != Status.CLAIMED) == STATUSES
    assert set(RETRYABLE) < set(FINISHED)
    assert set(PURGEABLE) == set(Status) - set(leased)
    assert all(isinstance(s, str) and not isinstance(s, Status) for s in JOB_STATUSES)
    assert set(JobStatus.values) == {*JOB_STATUSES, "purged"}
