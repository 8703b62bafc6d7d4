"""A catalogue of bad input: each case gets a clear error, and nothing is lost.

Refused input leaves the queue untouched; damaged data already in Redis fails its own
job with a readable error and never stops the worker from running the other jobs.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import re
from typing import Any

import pytest

from django_delayq import PayloadTooLarge, Queue
from django_delayq.connection import get_broker
from django_delayq.engine import EnqueueRequest
from django_delayq.engine.fields import logical, stored
from tests.conftest import system_checks, wait_until, worker_thread
from tests.testapp.tasks import record

NOW = dt.datetime.now(dt.UTC)


def nothing_enqueued(queue: str = "default") -> bool:
    return not any(Queue(queue).counts().values())


# -- arguments ------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "kwargs", "named"), [
    ((object(),), {}, "'tag'"),
    (("t",), {"extra": {1, 2}}, "'extra'"),
    (("t",), {"extra": b"bytes"}, "'extra'"),
    ((float("nan"),), {}, "'tag'"),
    (("t",), {"extra": {"deep": [1, float("inf")]}}, "'extra'"),
    (("t",), {"extra": {("tuple", "key"): 1}}, "'extra'"),
])
def test_arguments_that_are_not_json_are_refused_naming_the_argument(args, kwargs, named):
    with pytest.raises(TypeError, match=f"argument {named}.*not JSON serializable"):
        record.enqueue(*args, **kwargs)
    assert nothing_enqueued()


def test_arguments_nested_too_deeply_are_refused_naming_the_argument():
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(TypeError, match=r"argument 'extra'.*not JSON serializable"):
        record.enqueue("t", extra=deep)
    assert nothing_enqueued()


def test_django_json_types_round_trip_as_text(redis_client):
    job = record.enqueue("t", extra=[NOW, decimal.Decimal("1.10"), dt.date(2026, 1, 2)])
    assert job.refresh().kwargs == {"extra": [NOW.isoformat(timespec="milliseconds")
                                              .replace("+00:00", "Z"), "1.10", "2026-01-02"]}


def test_huge_payload_is_refused_with_payload_too_large(settings):
    settings.DELAYQ = {**settings.DELAYQ, "MAX_PAYLOAD_BYTES": 1024}
    with pytest.raises(PayloadTooLarge, match="MAX_PAYLOAD_BYTES"):
        record.enqueue("x" * 2000)
    assert isinstance(PayloadTooLarge("x"), ValueError)
    assert nothing_enqueued()
    assert record.enqueue("x" * 900).refresh().status == "ready"


def test_a_bad_job_in_enqueue_many_enqueues_nothing_of_its_chunk(settings):
    settings.DELAYQ = {**settings.DELAYQ, "MAX_PAYLOAD_BYTES": 1024}
    calls = [("a",), ("b",), ("x" * 2000,), ("c",)]
    with pytest.raises(PayloadTooLarge):
        record.enqueue_many(calls)
    assert nothing_enqueued()


# -- times ----------------------------------------------------------------------------


def test_naive_datetime_is_refused():
    with pytest.raises(ValueError, match="naive datetime"):
        record.using(run_at=dt.datetime(2030, 1, 1)).enqueue("t")
    assert nothing_enqueued()


def test_past_datetime_runs_as_soon_as_possible(redis_client):
    job = record.using(run_at=NOW - dt.timedelta(days=3650)).enqueue("past")
    assert job.status == "ready"
    with worker_thread(queues=["default"]):
        wait_until(lambda: job.refresh().status == "completed", message="past job to run")


@pytest.mark.parametrize(("delay", "error", "message"), [
    (-1, ValueError, "zero or more seconds"),
    (dt.timedelta(seconds=-5), ValueError, "zero or more seconds"),
    (float("nan"), ValueError, "zero or more seconds"),
    (float("inf"), ValueError, "zero or more seconds"),
    ("10", TypeError, "seconds .* or a timedelta"),
    (True, TypeError, "seconds .* or a timedelta"),
])
def test_bad_delays_are_refused(delay, error, message):
    with pytest.raises(error, match=message):
        get_broker().enqueue("default", record.name, ["t"], delay=delay)
    assert nothing_enqueued()


def test_run_at_that_is_not_a_datetime_is_refused():
    with pytest.raises(TypeError, match="aware datetime"):
        get_broker().enqueue("default", record.name, ["t"], run_at="2030-01-01T00:00:00Z")
    with pytest.raises(ValueError, match="run_at or delay, not both"):
        get_broker().enqueue("default", record.name, ["t"], run_at=NOW, delay=1)
    assert nothing_enqueued()


# -- priorities, ids, names -----------------------------------------------------------


@pytest.mark.parametrize(("priority", "error"), [
    (101, ValueError), (-101, ValueError), (10**30, ValueError),
    ("5", TypeError), (1.5, TypeError), (None, TypeError), (True, TypeError),
])
def test_priorities_out_of_range_or_not_int_are_refused(priority, error):
    with pytest.raises(error, match="priority"):
        get_broker().enqueue("default", record.name, ["t"], priority=priority)
    assert nothing_enqueued()


@pytest.mark.parametrize("job_id", [
    "", "x" * 129, "a b", "a{b}", "caf\u00e9", "a\n", "a\x00b", "a*", 42,
])
def test_odd_job_ids_are_refused(job_id):
    with pytest.raises(ValueError, match="invalid job id"):
        get_broker().enqueue("default", record.name, ["t"], job_id=job_id)
    assert nothing_enqueued()


@pytest.mark.parametrize("suffix", [":c", ":w", ":r"])
def test_an_id_naming_another_jobs_workflow_keys_is_refused(redis_client, suffix):
    """Job ``x:c``'s hash would be job ``x``'s set of dependants (``:w``, ``:r``: the
    parents it waits for, their results): cancelling one deleted the other, and linking
    either failed with WRONGTYPE. Refused before anything is written, by every way in."""
    parent = record.using(delay=3600).enqueue("p")
    keys = set(redis_client.keys("*"))
    taken = f"{parent.id}{suffix}"
    with pytest.raises(ValueError, match="may not end in :c, :w, :r"):
        record.using(job_id=taken).enqueue("t")
    with pytest.raises(ValueError, match="may not end in"):
        get_broker().enqueue("default", record.name, ["t"], job_id=taken)
    with pytest.raises(ValueError, match="may not end in"):
        get_broker().enqueue_many("default", [EnqueueRequest(task=record.name, job_id=taken)])
    assert set(redis_client.keys("*")) == keys
    child = record.using(depends_on=[parent], job_id=f"{parent.id}:cw").enqueue("c")
    assert child.refresh().status == "waiting", "other ids with a colon are fine"


def test_longest_job_id_is_accepted():
    job = record.using(job_id="x" * 128).enqueue("t")
    assert job.refresh().id == "x" * 128


@pytest.mark.parametrize("queue", [
    "", "x" * 65, "a b", "{q}", "q\n", "q:r", "\u00e9", "q*",
])
def test_odd_queue_names_are_refused(queue):
    with pytest.raises(ValueError, match="invalid queue name"):
        record.using(queue=queue).enqueue("t")
    with pytest.raises(ValueError, match="invalid queue name"):
        Queue(queue).counts()


@pytest.mark.parametrize("max_attempts", [0, -1, 1.5, "3", True])
def test_bad_max_attempts_are_refused(max_attempts):
    with pytest.raises(ValueError, match="max_attempts"):
        get_broker().enqueue("default", record.name, ["t"], max_attempts=max_attempts)
    assert nothing_enqueued()


@pytest.mark.parametrize("name", ["", "a\nb", "x" * 201, None])
def test_bad_task_names_are_refused(name):
    with pytest.raises(ValueError, match="invalid task name"):
        get_broker().enqueue("default", name, ["t"])
    assert nothing_enqueued()


# -- what a worker finds in Redis -----------------------------------------------------


def run_until_finished(job_ids: list[str]) -> dict[str, dict[str, str]]:
    """Run a worker until each job is finished; returns their hashes (logical names)."""
    broker = get_broker()
    keys = broker.shards("default")[0]

    def hashes() -> dict[str, dict[str, str]]:
        return {j: logical(broker.client.hgetall(keys.job(j))) for j in job_ids}

    with worker_thread(queues=["default"]):
        wait_until(lambda: all(h.get("status") in ("completed", "failed")
                               for h in hashes().values()), message="jobs to finish")
    return hashes()


def test_unknown_task_fails_the_job_cleanly_and_others_run(redis_client):
    broker = get_broker()
    unknown = broker.enqueue("default", "tests.testapp.tasks.no_such_task", ["t"]).job_id
    good = record.enqueue("after").id
    found = run_until_finished([unknown, good])
    assert found[unknown]["status"] == "failed"
    assert "UnknownTask" in found[unknown]["error"]
    assert "tests.testapp.tasks.no_such_task" in found[unknown]["error"]
    assert found[good]["status"] == "completed"


def damage(field: str, value: Any | None) -> str:
    """Enqueue a job, then overwrite (or, with None, delete) one (logical) field of its hash."""
    broker = get_broker()
    job_id = record.enqueue("damaged").id
    key = broker.shards("default")[0].job(job_id)
    if value is None:
        broker.client.hdel(key, stored(field))
    else:
        broker.client.hset(key, stored(field), value)
    return job_id


@pytest.mark.parametrize(("field", "value", "error"), [
    ("args", "{not json", "CorruptPayload"),
    ("args", "[" * 100_000 + "]" * 100_000, "CorruptPayload"),
    ("args", '{"tag": "x"}', "CorruptPayload"),
    ("kwargs", "[1, 2]", "CorruptPayload"),
    ("args", b"\x80\x81\xfe", "CorruptPayload"),
    ("args", None, "CorruptPayload"),
    ("task", None, "CorruptPayload"),
    ("task", "tests.testapp.tasks.record ", "UnknownTask"),
])
def test_damaged_job_fails_with_a_clear_error_and_others_run(redis_client, field, value, error):
    bad = damage(field, value)
    good = record.enqueue("good").id
    found = run_until_finished([bad, good])
    assert found[bad]["status"] == "failed"
    assert error in found[bad]["error"]
    assert found[good]["status"] == "completed"
    from django_delayq import Job

    assert Job.fetch(bad).status == "failed", "the damaged job can still be read"


@pytest.mark.parametrize(("field", "value"), [
    ("max_attempts", None), ("max_attempts", "many"), ("attempts", "abc"),
    ("priority", "high"), ("run_at", None), ("enqueued_at", "yesterday"),
])
def test_damaged_bookkeeping_fields_do_not_stop_the_job(redis_client, field, value):
    bad = damage(field, value)
    good = record.enqueue("good").id
    found = run_until_finished([bad, good])
    assert found[bad]["status"] == "completed"
    assert found[bad]["attempts"] == "1"
    assert found[good]["status"] == "completed"


def test_damaged_priority_of_a_scheduled_job_does_not_stop_promotion(redis_client):
    broker = get_broker()
    keys = broker.shards("default")[0]
    later = record.using(delay=0.2).enqueue("bad-priority").id
    broker.client.hset(keys.job(later), stored("priority"), "urgent")
    other = record.using(delay=0.2).enqueue("other").id
    found = run_until_finished([later, other])
    assert {found[later]["status"], found[other]["status"]} == {"completed"}


def test_ids_with_no_job_hash_are_dropped_and_reported(redis_client, caplog):
    broker = get_broker()
    keys = broker.shards("default")[0]
    now = broker.server_time_ms()
    redis_client.zadd(keys.ready, {"ghost-ready": 1})
    redis_client.zadd(keys.scheduled, {"ghost-scheduled": now - 1})
    redis_client.zadd(keys.active, {"ghost-active": now - 1})
    good = record.enqueue("good").id
    caplog.set_level(logging.WARNING, logger="django_delayq")
    assert broker.reclaim("default") == (0, 0)
    found = run_until_finished([good])
    assert found[good]["status"] == "completed"
    orphaned = [f["job"] for _, f in redis_client.xrange(keys.events)
                if f["event"] == "orphaned"]
    assert sorted(orphaned) == ["ghost-active", "ghost-ready", "ghost-scheduled"]
    for key in (keys.ready, keys.scheduled, keys.active):
        assert redis_client.zcard(key) == 0
    assert [r.jobs for r in caplog.records
            if r.getMessage().startswith("dropped job ids with no job data")] == [2]



# -- settings -------------------------------------------------------------------------

#: One bad DELAYQ per system check id of checks.py (E001: DELAYQ itself is not a dict).
CHECK_CASES: dict[str, Any] = {
    "E001": ["REDIS_URL", "redis://"],
    "E002": {"REDIS_URL": "http://example.com"},
    "E003": {"CACHE_ALIAS": "no-such-cache"},
    "E004": {"SOCKET_TIMEOUT": -1},
    "E005": {"SOCKET_CONNECT_TIMEOUT": None},
    "E006": {"PREFIX": "dq\n"},
    "E007": {"DEFAULT_QUEUE": "a b"},
    "E008": {"MAX_ATTEMPTS": True},
    "E009": {"RETRY_BACKOFF": "2"},
    "E010": {"RETRY_BACKOFF_MAX": -0.5},
    "E011": {"LEASE": 0},
    "E012": {"CONCURRENCY": 0},
    "E013": {"GRACE_PERIOD": float("-inf")},
    "E014": {"BLOCK_TIMEOUT": []},
    "E015": {"RESULT_TTL": -1},
    "E016": {"FAILED_TTL": "week"},
    "E017": {"KEEP_COMPLETED": 1.5},
    "E018": {"KEEP_FAILED": None},
    "E019": {"EVENTS_MAXLEN": -1},
    "E020": {"MAX_PAYLOAD_BYTES": "1MB"},
    "E130": {"RESULT_MAX_BYTES": "1MB"},
    "E131": {"EVENTS_MAX_BYTES": -1},
    "E132": {"ERROR_MAX_BYTES": "20k"},
    "E133": {"PROGRESS_MAX_BYTES": None},
    "E021": {"SHARDS": {"q": 2000}},
    "E022": {"REDIS_ULR": "redis://127.0.0.1:6379/0"},
    "E023": {"QUEUES": {"q": {"rate_limit": "lots"}}},
    "E024": {"CLUSTER": "yes"},
    "E025": {"CRON_LOOKAHEAD": 0},
    "E026": {"CRON_MISSED": "never"},
    "E027": {"CRON_CATCH_UP_MAX": 0},
    "E028": {"EAGER": "sometimes"},
    "E030": {"MIRROR_RETENTION": -1},
    "E031": {"MIRROR_BATCH_SIZE": 0},
    "E032": {"MIRROR_CLAIM_IDLE": "1m"},
    "E033": {"LAKE_PATH": ["/tmp/lake"]},
    "E040": {"API_PERMISSION_CLASSES": ["no.such.Permission"]},
    "E060": {"SPARK_MASTER": "local[0]"},
    "E070": {"MIN_REPLICAS": -1},
    "E071": {"MIN_REPLICAS_TIMEOUT": 0},
    "E072": {"MIN_REPLICAS_ACKS": "yes"},
    "E073": {"FAILOVER_RETRY": -1},
    "E080": {"PROCESSES": 0},
    "E081": {"MAX_JOBS_PER_CHILD": 0},
    "E082": {"MAX_MEMORY_PER_CHILD": "1G"},
    "E083": {"ASYNC_CONCURRENCY": 0},
    "E084": {"TIMEOUT": -1},
    "E088": {"MAX_PROCESSES": 0},
    "E089": {"MAX_CONCURRENCY": 0},
    "E090": {"OUTBOX": {"CHUNK_SIZE": 0}},
    "E140": {"API_ANY_QUEUE": "yes"},
}


def test_every_check_id_of_checks_py_has_a_case():
    from pathlib import Path

    import django_delayq.checks
    import django_delayq.conf

    source = (Path(django_delayq.checks.__file__).read_text()
              + Path(django_delayq.conf.__file__).read_text())
    found = set(re.findall(r"E\d{3}", source))
    missing = sorted(found - set(CHECK_CASES))
    assert not missing, f"add a case to CHECK_CASES in tests/test_bad_input.py for {missing}"


@pytest.mark.parametrize("check_id", sorted(CHECK_CASES))
def test_each_bad_setting_fires_its_own_check(check_id):
    from django.test import override_settings

    with override_settings(DELAYQ=CHECK_CASES[check_id]):
        found = {m.id for m in system_checks() if m.id.startswith("django_delayq.")}
    assert found == {f"django_delayq.{check_id}"}
