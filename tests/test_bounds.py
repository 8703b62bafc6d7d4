"""Redis bounded by the settings: KEEP_* trims job records, results, errors and progress
messages have a size limit, an ack Redis refuses fails its job alone, the events stream
stays under its byte bound."""

from __future__ import annotations

import json
from typing import Any

from django_delayq import JobSpec, Queue, connection
from django_delayq.engine import QueueKeys
from django_delayq.testing import RedisServer
from tests.conftest import ran, wait_until
from tests.testapp import tasks


def job_records(client: Any, keys: QueueKeys) -> list[str]:
    """The ids of the job hashes of one queue shard in Redis."""
    prefix = keys.job_prefix
    return sorted(key[len(prefix):] for key in client.scan_iter(match=f"{prefix}*", count=1000)
                  if ":" not in key[len(prefix):])


def test_keep_completed_trims_job_records(spawned: Any, redis_client: Any, broker: Any) -> None:
    for i in range(200):
        tasks.record.using(job_id=f"keep-{i}").enqueue(f"keep-{i}")
    proc, out = spawned("default", "-c", "4", "--no-mirror",
                        env={"DELAYQ_TEST_SETTINGS": json.dumps({"KEEP_COMPLETED": 5})})
    queue = Queue("default")
    wait_until(lambda: len(ran(redis_client)) == 200, timeout=120, message="200 jobs run")
    wait_until(lambda: queue.counts()["active"] == 0, timeout=60,
               message=f"every ack landed: {queue.counts()}")
    keys = QueueKeys(broker.config.prefix, "default")
    records = job_records(redis_client, keys)
    assert len(records) == 5, records
    assert queue.counts()["completed"] == 5
    # The newest five stay; a trimmed id no longer deduplicates: it is a new job.
    kept = {f"keep-{i}" for i in range(195, 200)}
    assert set(records) <= {f"keep-{i}" for i in range(200)}
    again = tasks.record.using(job_id="keep-0").enqueue("again")
    assert again.created, again
    if set(records) == kept:  # FIFO within one priority, four threads: almost always
        assert not tasks.record.using(job_id="keep-199").enqueue("dup").created
    proc.terminate()
    assert proc.wait(timeout=60) == 0, out.text


def finish_after_a_large_result(spawned: Any, redis_client: Any, mib: float,
                                redis_url: str | None = None,
                                settings: dict[str, Any] | None = None) -> tuple[Any, str]:
    """Through a real worker (one thread, so every job shares its acker): quick jobs
    before and after a ``mib`` MiB result; every quick job completes, the large one fails
    with no result kept. Returns the large job and the worker's output."""
    before = [tasks.record.enqueue(f"before-{i}") for i in range(3)]
    large = tasks.returns_mib.enqueue(mib)
    after = [tasks.record.enqueue(f"after-{i}") for i in range(3)]
    proc, out = spawned("default", "-c", "1", "--no-mirror", redis_url=redis_url,
                        env={"DELAYQ_TEST_SETTINGS": json.dumps(settings or {})})
    wait_until(lambda: large.refresh().status == "failed", timeout=120,
               message=f"the large job to fail:\n{out.text}")
    later = [tasks.record.enqueue(f"later-{i}") for i in range(3)]
    for job in before + after + later:
        wait_until(lambda job=job: job.refresh().status == "completed", timeout=60,
                   message=f"{job.id} to complete:\n{out.text}")
    assert large.result is None
    assert large.attempts == 1, "a result over a limit is not retried"
    assert Queue("default").counts()["active"] == 0
    proc.terminate()  # SIGTERM still stops it, at once: nothing is held
    assert proc.wait(timeout=30) == 0, out.text
    return large, out.text


def test_a_result_over_result_max_bytes_fails_its_job(spawned: Any, redis_client: Any) -> None:
    large, _ = finish_after_a_large_result(spawned, redis_client, 50)
    assert large.error.startswith("django_delayq.engine.errors.ResultTooLarge: "), large.error
    assert "52428802 bytes" in large.error
    assert "RESULT_MAX_BYTES" in large.error
    assert redis_client.memory_usage(large_key(large)) < 100_000


def test_an_ack_redis_refuses_fails_its_job_alone(spawned: Any, settings: Any) -> None:
    """With no RESULT_MAX_BYTES, an 8 MB result sent to a Redis that takes 4 MB at
    most: Redis drops the connection; that job fails (AckRefused), the others' acks
    land, and the worker goes on."""
    with RedisServer(extra_args=("--proto-max-bulk-len", "4mb")) as server:
        settings.DELAYQ = {**settings.DELAYQ, "REDIS_URL": server.url}
        connection.reset()
        client = connection.get_broker().client
        large, output = finish_after_a_large_result(
            spawned, client, 8, redis_url=server.url, settings={"RESULT_MAX_BYTES": 0})
        assert large.error.startswith("django_delayq.engine.errors.AckRefused: "), large.error
        assert "Redis refused the ack of a job" in output
        connection.reset()


def large_key(job: Any) -> str:
    return connection.get_broker().keys_for(job.queue, job.id).job(job.id)


def stream_bytes(client: Any, key: str) -> int:
    """The stream's memory, every node counted (no sampling)."""
    return int(client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)


def test_bulk_enqueues_keep_the_events_stream_under_its_byte_bound(
        spawned: Any, redis_client: Any, broker: Any, settings: Any) -> None:
    """Bulk entries (1,000 job ids of 120 bytes: ~120 KB each) and the worker's batched
    claimed/started/completed entries: the stream stays under EVENTS_MAX_BYTES, which
    trims it long before EVENTS_MAXLEN does."""
    bound = 512 * 1024
    settings.DELAYQ = {**settings.DELAYQ, "EVENTS_MAX_BYTES": bound}
    connection.reset()
    events = QueueKeys(broker.config.prefix, "default").events
    client = connection.get_broker().client
    sizes = []
    for chunk in range(12):
        bulk = tasks.record.enqueue_many(
            [JobSpec([f"b{chunk}-{i}"], job_id=f"{chunk:02d}-{i:04d}-" + "x" * 112)
             for i in range(1000)])
        assert bulk.enqueued == 1000
        sizes.append(stream_bytes(client, events))
    assert max(sizes) <= bound, sizes
    assert client.xlen(events) >= 2  # trimmed to the bound, not emptied
    proc, out = spawned("default", "-c", "4", "--no-mirror",
                        env={"DELAYQ_TEST_SETTINGS": json.dumps({"EVENTS_MAX_BYTES": bound})})
    queue = Queue("default")
    wait_until(lambda: queue.counts()["ready"] + queue.counts()["active"] == 0, timeout=240,
               message=f"12,000 jobs done: {queue.counts()}")
    assert stream_bytes(client, events) <= bound
    last = client.xrevrange(events, count=1)[0][1]
    assert last["event"] == "completed", last
    proc.terminate()
    assert proc.wait(timeout=60) == 0, out.text


def test_error_max_bytes_bounds_the_error_and_traceback_kept(spawned: Any) -> None:
    job = tasks.raises_value_error.enqueue("é" * 20_000)  # 40 KB of UTF-8
    proc, out = spawned("default", "-c", "1", "--no-mirror",
                        env={"DELAYQ_TEST_SETTINGS": json.dumps({"ERROR_MAX_BYTES": 1000})})
    wait_until(lambda: job.refresh().status == "failed", timeout=60,
               message=f"the job to fail:\n{out.text}")
    assert job.error.startswith("builtins.ValueError: éé")
    assert len(job.error.encode()) <= 1000
    assert len(job.traceback.encode()) <= 1000
    assert job.traceback.endswith("éé\n")  # its end: the frames nearest the error
    proc.terminate()
    assert proc.wait(timeout=60) == 0, out.text


def test_a_large_result_under_the_bound_is_acked_on_its_own_and_kept(
        spawned: Any, redis_client: Any) -> None:
    """A result over LARGE_ACK (256 KiB) but under RESULT_MAX_BYTES goes in a round trip
    of its own and lands whole, as do the quick jobs around it."""
    quick = [tasks.record.enqueue(f"q-{i}") for i in range(4)]
    large = tasks.returns_mib.enqueue(0.5)
    quick += [tasks.record.enqueue(f"q-{i}") for i in range(4, 8)]
    proc, out = spawned("default", "-c", "2", "--no-mirror")
    for job in [*quick, large]:
        wait_until(lambda job=job: job.refresh().status == "completed", timeout=60,
                   message=f"{job.id} to complete:\n{out.text}")
    assert large.result == "x" * (512 * 1024)
    proc.terminate()
    assert proc.wait(timeout=60) == 0, out.text
