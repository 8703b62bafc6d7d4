"""Redis bounded by the settings: KEEP_* trims job records, results, errors and progress
messages have a size limit, an ack Redis refuses fails its job alone, the events stream
stays under its byte bound."""

from __future__ import annotations

import json
from typing import Any

from django_delayq import Queue
from django_delayq.engine import QueueKeys
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
