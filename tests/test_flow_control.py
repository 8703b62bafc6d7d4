"""Flow control on one Redis: rate limits, interval queues, pause across shards."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from typing import Any

import pytest

from django_delayq import Job, Queue
from django_delayq.connection import get_broker
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.engine.limits import RateLimit, interval_limit, parse_rate, queue_options
from tests.conftest import (
    ROOT,
    OutputReader,
    ran,
    system_checks,
    wait_until,
    worker_env,
    worker_thread,
)
from tests.testapp import tasks


def claim_times(queue: str) -> dict[str, int]:
    """When each job of ``queue`` was last claimed (Redis clock, ms): the starts a rate
    limit counts, from the ``claimed`` events (``started_at`` is when a thread began)."""
    broker = get_broker()
    times: dict[str, int] = {}
    for keys in broker.shards(queue):
        for _, fields in broker.client.xrange(keys.events):
            if fields.get("event") == "claimed":
                ids = fields["jobs"].split(" ") if "jobs" in fields else [fields["job"]]
                times.update(dict.fromkeys(ids, int(fields["ts"])))
    return times


def claimed_at(queue: str, job_ids: list[str]) -> list[int]:
    """The claim times (Redis clock, ms) of jobs, in order."""
    times = claim_times(queue)
    for job_id in job_ids:
        assert job_id in times, f"{job_id} was never claimed"
        assert Job.fetch(job_id, queue).started_at is not None, f"{job_id} did not start"
    return sorted(times[job_id] for job_id in job_ids)


def most_in_any_window(times: list[int], window_ms: int) -> int:
    """The largest number of times that fall inside one window of ``window_ms``."""
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= window_ms:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def start_workers(n: int, queue: str, settings: dict[str, Any], redis_url: str | None = None,
                  extra_env: dict[str, str] | None = None,
                  ) -> list[tuple[subprocess.Popen[str], OutputReader]]:
    """``runworker QUEUE`` in ``n`` processes, with more DELAYQ ``settings``."""
    env = worker_env(redis_url, DELAYQ_TEST_SETTINGS=json.dumps(settings), **(extra_env or {}))
    procs = []
    for _ in range(n):
        proc = subprocess.Popen([sys.executable, "-m", "django", "runworker", queue],
                                cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        procs.append((proc, OutputReader(proc)))
    return procs


def stop_workers(procs: list[tuple[subprocess.Popen[str], OutputReader]]) -> None:
    for proc, _ in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc, reader in procs:
        try:
            assert proc.wait(timeout=30) == 0, reader.text
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            reader._thread.join(timeout=5)
            if proc.stdout is not None:
                proc.stdout.close()


# -- parsing and checks -------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("100/m", RateLimit(100, 60_000)), ("5/s", RateLimit(5, 1_000)),
    ("10/30s", RateLimit(10, 30_000)), (" 7 / h ", RateLimit(7, 3_600_000)),
    ("1/0.5s", RateLimit(1, 500)),
])
def test_rate_limits_parse(text, expected):
    assert parse_rate(text) == expected


@pytest.mark.parametrize("text", ["100", "0/m", "10/y", "-1/s", 5, "ten/m"])
def test_bad_rate_limits_are_refused_with_the_expected_shape(text):
    with pytest.raises(ValueError, match="rate limit"):
        parse_rate(text)


def test_queue_options_and_their_errors():
    assert queue_options({"interval": 0.5, "shards": 4}).limit == interval_limit(0.5)
    assert queue_options({"shards": 3}).shards == 3
    with pytest.raises(ValueError, match="not both"):
        queue_options({"interval": 1, "rate_limit": "1/s"})
    with pytest.raises(ValueError, match="unknown queue options"):
        queue_options({"rate": "1/s"})
    with pytest.raises(ValueError, match="interval"):
        queue_options({"interval": 0})


def test_system_checks_name_bad_flow_control_settings(settings):
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"emails": {"rate_limit": "lots"},
                                                     "bad name!": {}},
                       "CLUSTER": "yes", "CRON_MISSED": "sometimes", "CRON_LOOKAHEAD": 0}
    ids = sorted(e.id for e in system_checks() if e.id.startswith("django_delayq"))
    assert ids == ["django_delayq.E023", "django_delayq.E023", "django_delayq.E024",
                   "django_delayq.E025", "django_delayq.E026"]


def test_settings_build_the_engine_config(settings, broker):
    from django_delayq.connection import engine_config

    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"a": {"shards": 2},
                                                     "b": {"shards": 5, "rate_limit": "3/s"},
                                                     "c": {"interval": 2}}}
    config = engine_config()
    assert dict(config.shards) == {"a": 2, "b": 5, "c": 1}
    assert dict(config.limits) == {"b": RateLimit(3, 1000), "c": RateLimit(1, 2000)}


# -- the limiter in the claim script --------------------------------------------------


def test_claim_starts_no_more_than_the_window_allows_over_all_shards(redis_client):
    broker = Broker(redis_client, EngineConfig(prefix="t", queues={
        "q": {"shards": 4, "rate_limit": "5/m"}}))
    broker.enqueue_many("q", [EnqueueRequest(task="t.x", args=[i]) for i in range(20)])
    results = broker.claim("q", 10, "w1")
    assert sum(len(r.jobs) for r in results) == 5
    redis_client.delete(*(k.marker for k in broker.shards("q")))
    again = broker.claim("q", 10, "w2")
    assert sum(len(r.jobs) for r in again) == 0
    waits = [r.limit_wait_ms for r in again if r.limit_wait_ms is not None]
    assert waits
    assert all(55_000 < w <= 60_000 for w in waits)
    # a full window does not re-arm the wake-up markers: idle workers sleep, not spin
    assert sum(redis_client.zcard(k.ready) for k in broker.shards("q")) == 15
    assert all(redis_client.zcard(k.marker) == 0 for k in broker.shards("q"))


def test_interval_queue_claims_one_job_per_interval(redis_client):
    broker = Broker(redis_client, EngineConfig(prefix="t", queues={"q": {"interval": 30}}))
    broker.enqueue_many("q", [EnqueueRequest(task="t.x", args=[i]) for i in range(3)])
    (first,) = broker.claim("q", 10, "w")
    (second,) = broker.claim("q", 10, "w")
    assert (len(first.jobs), len(second.jobs)) == (1, 0)
    assert 29_000 < second.limit_wait_ms <= 30_000


def test_estimated_start_on_an_interval_queue(settings, redis_client):
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"spaced": {"interval": 10}}}
    jobs = [tasks.record.using(queue="spaced").enqueue(f"e{i}") for i in range(3)]
    assert [j.position() for j in jobs] == [0, 1, 2]
    now = jobs[0].enqueued_at.timestamp()
    first, _, third = (j.estimated_start().timestamp() for j in jobs)
    assert first == pytest.approx(now, abs=1)
    assert third == pytest.approx(now + 20, abs=1)
    assert tasks.record.enqueue("free").estimated_start() is None


def test_rate_limited_worker_sleeps_until_the_next_slot(settings, redis_client):
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"limited": {"rate_limit": "4/s"}}}
    jobs = [tasks.record.using(queue="limited").enqueue(f"r{i}") for i in range(12)]
    before = int(redis_client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    with worker_thread(queues=["limited"], concurrency=4):
        wait_until(lambda: len(ran(redis_client)) == 12, message="12 limited jobs")
    calls = int(redis_client.info("commandstats")["cmdstat_evalsha"]["calls"]) - before
    times = claimed_at("limited", [j.id for j in jobs])
    assert most_in_any_window(times, 1000) <= 4
    assert times[-1] - times[0] >= 2000, "12 starts at 4/s span at least two windows"
    # claims, acks, extends: a few per window; a worker polling the limit would make
    # hundreds of calls in these 2+ seconds
    assert calls < 80, calls


@pytest.mark.slow
def test_interval_queue_spaces_starts_across_worker_processes_and_shards(settings,
                                                                           redis_client):
    queues = {"spaced": {"interval": 0.25, "shards": 3}}
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": queues}
    procs = start_workers(3, "spaced", {"QUEUES": queues})
    try:
        # every worker up before the jobs: on a busy machine the first one up would
        # otherwise take them all while the others still start
        for _, out in procs:
            out.wait_for("worker started", timeout=120)
        jobs = [tasks.record.using(queue="spaced").enqueue(f"s{i}") for i in range(12)]
        wait_until(lambda: len(ran(redis_client)) == 12, timeout=60, message="12 jobs")
    finally:
        stop_workers(procs)
    times = claimed_at("spaced", [j.id for j in jobs])
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 250, gaps
    assert len({r["pid"] for r in ran(redis_client)}) >= 2, "several workers took part"


# -- pause ------------------------------------------------------------------------------


def test_pause_holds_every_shard_for_every_worker_and_still_accepts_jobs(settings,
                                                                          redis_client):
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"held": {"shards": 4}}}
    queue = Queue("held")
    queue.pause()
    assert queue.is_paused
    jobs = [tasks.record.using(queue="held").enqueue(f"p{i}") for i in range(20)]
    assert all(j.created and j.status == "ready" for j in jobs)
    assert queue.counts()["ready"] == 20
    with worker_thread(queues=["held"], block_timeout=0.3) as one, \
            worker_thread(queues=["held"], block_timeout=0.3) as two:
        # both workers claimed every shard several times while the queue was paused
        wait_until(lambda: one.fetcher.rotation >= 3 and two.fetcher.rotation >= 3,
                   message="claims")
        assert ran(redis_client) == []
        assert queue.counts()["ready"] == 20
        queue.resume()
        wait_until(lambda: len(ran(redis_client)) == 20, message="jobs after resume")
    assert not queue.is_paused
    assert {r["tag"] for r in ran(redis_client)} == {f"p{i}" for i in range(20)}


def test_limited_jobs_are_claimed_only_for_idle_threads(settings, redis_client):
    settings.DELAYQ = {**settings.DELAYQ, "QUEUES": {"limited": {"rate_limit": "100/s"}}}
    tasks.gated.enqueue("busy", "test:gate")
    with worker_thread(queues=["default", "limited"], concurrency=1, prefetch=4) as worker:
        wait_until(lambda: ran(redis_client), message="the gated job to start")
        rotation = worker.fetcher.rotation
        limited = tasks.record.using(queue="limited").enqueue("limited")
        wait_until(lambda: worker.fetcher.rotation > rotation + 1, message="claims while busy")
        assert limited.refresh().status == "ready", "not prefetched while no thread is idle"
        redis_client.set("test:gate", "1")
        wait_until(lambda: limited.refresh().status == "completed", message="limited job")
    gate_end = next(r["redis_ms"] for r in ran(redis_client) if r["task"] == "gated-end")
    assert limited.started_at.timestamp() * 1000 >= gate_end - 1


def test_reservations_grant_what_the_window_has_and_settle_to_real_start_times(redis_client):
    from django_delayq.engine.reservations import reserve, settle

    broker = Broker(redis_client, EngineConfig(prefix="t", queues={"q": {"rate_limit": "3/m"}}))
    key = broker.limit_key("q")
    granted, wait = reserve(broker, "q", 5, "w1:a")
    assert (granted, wait is not None) == (3, True)
    assert reserve(broker, "q", 1, "w2:b")[0] == 0
    later = broker.server_time_ms() + 500
    settle(broker, "q", "w1:a", granted, [later])
    assert redis_client.zrange(key, 0, -1, withscores=True) == [("w1:a:1", later)]
    assert reserve(broker, "q", 5, "w3:c")[0] == 2
