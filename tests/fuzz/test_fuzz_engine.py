"""Property-based fuzzing of the engine's scripts against the real test Redis.

A state machine enqueues (alone and in bulk) with random names, ids, times and options,
valid or not, claims, completes, fails, cancels, retries and reschedules, damages job
hashes and writes garbled events, and runs the model mirror. After every step:

- each job id is in at most one status set, and every job created is in exactly one;
- the queue's counts match the sets;
- a refused call left no trace (every key as it was);
- every reader (``Job.fetch``, ``Queue.jobs``, ``Queue.all``) answers;
- after a mirror run nothing is pending and every row's status equals Redis's.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from django_delayq import Job, Queue, connection
from django_delayq.connection import get_broker
from django_delayq.engine import EnqueueRequest, JobNotFound
from django_delayq.engine.errors import InvalidJobState
from django_delayq.engine.fields import STORED
from django_delayq.engine.keys import STATUSES
from django_delayq.mirror import GROUP, Mirror
from django_delayq.models import Job as Row
from tests.fuzz.conftest import count_example
from tests.testapp.tasks import record

QUEUES = ["default", "fz"]
TASK = record.name

# -- values, valid and not --------------------------------------------------------------

ids = st.one_of(
    st.none(),
    st.text(alphabet="abcAZ09_.:@+=/-", min_size=1, max_size=12),
    st.text(max_size=6),  # anything: spaces, control characters, non-ASCII
    st.sampled_from(["..", ".", "a//b", "../../x", "x" * 129, "", "ok/.."]),
)
times = st.one_of(
    st.none(),
    st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30),
                 timezones=st.timezones()),
    st.datetimes(min_value=dt.datetime(1960, 1, 1), max_value=dt.datetime(2100, 1, 1),
                 timezones=st.just(dt.UTC)),
)
delays = st.one_of(
    st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10**12),
    st.booleans(), st.timedeltas(), st.sampled_from([0, 0.001, 1e30, 3600]),
)
priorities = st.one_of(st.integers(-200, 200), st.booleans(), st.floats(-5, 5),
                       st.sampled_from([0, 100, -100, 10**30]))
attempts = st.one_of(st.integers(-2, 20_000), st.booleans(), st.just(10**30))
field_names = st.sampled_from(sorted(STORED.values()))
junk = st.one_of(st.text(max_size=20), st.integers(-10**40, 10**40).map(str),
                 st.floats().map(repr), st.sampled_from(["", "1e400", "-1", "nan"]))


def snapshot() -> dict[str, Any]:
    """Every key with its content."""
    client = get_broker().client
    out: dict[str, Any] = {}
    for key in sorted(client.scan_iter("*")):
        kind = client.type(key)
        if kind == "hash":
            out[key] = client.hgetall(key)
        elif kind == "zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            out[key] = client.xlen(key)
        elif kind == "list":
            out[key] = client.lrange(key, 0, -1)
        else:
            out[key] = client.dump(key)
    return out


class EngineMachine(RuleBasedStateMachine):
    """Random engine operations; the invariants hold after every one."""

    @initialize()
    def start(self) -> None:
        count_example("engine")
        connection.reset()  # a fresh broker: it caches which queues the queues set holds
        self.broker = get_broker()
        self.broker.client.flushdb()
        Row.objects.all().delete()
        self.created: set[tuple[str, str]] = set()  # (queue, id) of jobs that exist
        self.damaged: set[tuple[str, str]] = set()

    # -- producing ----------------------------------------------------------------------

    def _refused_leaves_no_trace(self, call: Any) -> Any:
        before = snapshot()
        try:
            return call()
        except (TypeError, ValueError):
            assert snapshot() == before, "a refused call wrote something"
            return None

    @rule(queue=st.sampled_from(QUEUES), job_id=ids, run_at=times, delay=delays,
          priority=priorities, max_attempts=attempts)
    def enqueue(self, queue: str, job_id: Any, run_at: Any, delay: Any, priority: Any,
                max_attempts: Any) -> None:
        def call() -> Job:
            options = {k: v for k, v in {"job_id": job_id, "run_at": run_at,
                                         "delay": delay}.items() if v is not None}
            return record.using(queue=queue, priority=priority, max_attempts=max_attempts,
                                **options).enqueue("fz")
        job = self._refused_leaves_no_trace(call)
        if job is not None:
            self.created.add((queue, job.id))
            assert job.run_at is not None
            assert job.enqueued_at is not None
            fetched = Job.fetch(job.id, queue)
            if (queue, job.id) not in self.damaged:
                assert fetched.damaged == {}

    @rule(queue=st.sampled_from(QUEUES),
          items=st.lists(st.tuples(ids, times, delays, priorities, attempts), max_size=5))
    def enqueue_many(self, queue: str, items: list[tuple[Any, ...]]) -> None:
        def call() -> Any:
            requests = [EnqueueRequest(task=TASK, args=["fz"], job_id=i,
                                       run_at=r, delay=None if r is not None else d,
                                       priority=p, max_attempts=m)
                        for i, r, d, p, m in items]
            return self.broker.enqueue_many(queue, requests)
        result = self._refused_leaves_no_trace(call)
        if result is not None:
            self.created.update((queue, job_id) for job_id in result.job_ids)

    @rule(queue=st.text(max_size=70), many=st.booleans())
    def enqueue_on_any_queue_name(self, queue: str, many: bool) -> None:
        def call() -> Any:
            if many:
                return self.broker.enqueue_many(queue, [EnqueueRequest(task=TASK)])
            return self.broker.enqueue(queue, TASK, ["fz"])
        if self._refused_leaves_no_trace(call) is not None and queue not in QUEUES:
            self.broker.client.flushdb()  # a valid name outside the ones checked: start over
            self.created.clear()
            connection.reset()
            self.broker = get_broker()

    # -- the worker protocol -----------------------------------------------------------

    @rule(queue=st.sampled_from(QUEUES), n=st.integers(1, 5), outcome=st.booleans(),
          retry=st.booleans())
    def claim_and_finish(self, queue: str, n: int, outcome: bool, retry: bool) -> None:
        for result in self.broker.claim(queue, n, "fuzz-worker"):
            batch = self.broker.batch()
            for job in result.jobs:
                if outcome:
                    self.broker.add_complete(batch, job.keys, [(job.id, job.attempt, "null")])
                else:
                    self.broker.add_fail(batch, job.keys, job.id, job.attempt, "E: fz", "tb",
                                         0 if retry else -1)
            if len(batch):
                batch.run()

    # -- operations on one job -----------------------------------------------------------

    @precondition(lambda self: self.created)
    @rule(data=st.data(), run_at=times, delay=delays, priority=st.none() | priorities)
    def change_one(self, data: Any, run_at: Any, delay: Any, priority: Any) -> None:
        queue, job_id = data.draw(st.sampled_from(sorted(self.created)))
        job = Job(id=job_id, queue=queue)
        action = data.draw(st.sampled_from(["cancel", "retry", "reschedule"]))
        try:
            if action == "cancel":
                job.cancel()
            elif action == "retry":
                self._refused_leaves_no_trace(lambda: job.retry(run_at=run_at, delay=delay))
            else:
                self._refused_leaves_no_trace(
                    lambda: job.reschedule(run_at=run_at, delay=delay, priority=priority))
        except (InvalidJobState, JobNotFound):
            pass

    @precondition(lambda self: self.created)
    @rule(data=st.data(), field=field_names, value=junk)
    def damage_a_hash(self, data: Any, field: str, value: str) -> None:
        queue, job_id = data.draw(st.sampled_from(sorted(self.created)))
        key = self.broker.keys_for(queue, job_id).job(job_id)
        if self.broker.client.type(key) == "hash" and field != STORED["status"]:
            self.broker.client.hset(key, field, value)
            self.damaged.add((queue, job_id))

    @rule(queue=st.sampled_from(QUEUES),
          fields=st.dictionaries(st.sampled_from(["event", "job", "jobs", "ts", "run_at",
                                                  "attempt", "attempts", "x"]),
                                 junk, min_size=1, max_size=5))
    def garbled_event(self, queue: str, fields: dict[str, str]) -> None:
        self.broker.client.xadd(self.broker.shards(queue)[0].events, fields)

    @rule()
    def mirror(self) -> None:
        Mirror(block=0.05, claim_idle=0).run(burst=True, timeout=60)
        client = self.broker.client
        for queue in QUEUES:
            for keys in self.broker.shards(queue):
                groups = client.xinfo_groups(keys.events) if client.exists(keys.events) else []
                if any(g["name"] == GROUP for g in groups):  # a queue the mirror follows
                    assert int(client.xpending(keys.events, GROUP)["pending"]) == 0
        rows = {(r.queue, r.job_id): r.status for r in Row.objects.all()}
        for queue, job_id in self.created:
            live = Job.fetch(job_id, queue)
            if live.status in STATUSES:
                assert rows.get((queue, job_id)) == live.status, (queue, job_id)

    # -- invariants ----------------------------------------------------------------------

    @invariant()
    def each_id_in_at_most_one_set_and_counts_match(self) -> None:
        if not hasattr(self, "broker"):
            return
        client = self.broker.client
        for queue in QUEUES:
            seen: dict[str, str] = {}
            counts = Queue(queue).counts() if client.sismember(
                self.broker.global_keys.queues, queue) else dict.fromkeys(STATUSES, 0)
            for status in STATUSES:
                members = [m for keys in self.broker.shards(queue)
                           for m in client.zrange(keys.status_set(status), 0, -1)]
                assert counts[status] == len(members)
                for job_id in members:
                    assert job_id not in seen, f"{job_id} is {seen.get(job_id)} and {status}"
                    seen[job_id] = status
            mine = {job_id for q, job_id in self.created if q == queue}
            assert mine <= set(seen), f"jobs in no set: {sorted(mine - set(seen))[:5]}"

    @invariant()
    def readers_answer(self) -> None:
        if not hasattr(self, "broker"):
            return
        names = {q.name for q in Queue.all()}
        for queue in names & set(QUEUES):
            for status in STATUSES:
                for job in Queue(queue).jobs(status, limit=20):
                    assert isinstance(job.damaged, dict)
        for queue, job_id in sorted(self.created)[:20]:
            Job.fetch(job_id, queue)


@pytest.mark.timeout(3600)  # the fuzz profile runs long; the default one ~1 min
@pytest.mark.django_db
def test_engine_state_machine() -> None:
    EngineMachine.TestCase().runTest()
