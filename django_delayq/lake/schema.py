"""The lake's row: one event of one job, as read from a queue shard's events stream.

An entry naming several jobs (a bulk enqueue, a claim, an ack) becomes one row per job.
The columns after ``error`` are read from the job HASH at export time (the events do not
carry them): the task, priority and attempt limit with each ``enqueued`` row, and the
attempt's start from the hash's attempt log with each row that ends an attempt.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

TS = pa.timestamp("ms", tz="UTC")

ARROW_SCHEMA = pa.schema([
    ("stream_id", pa.string()),   # the entry's id in its stream, "ms-seq"
    ("stream_ms", pa.int64()),    # its two halves, to sort and compare by
    ("stream_seq", pa.int64()),
    ("queue", pa.string()),
    ("shard", pa.int32()),        # null for a queue with one shard
    ("event", pa.string()),       # enqueued, claimed, started, completed, failed, ...
    ("job_id", pa.string()),
    ("ts", TS),                   # when it happened (the Redis clock)
    ("attempt", pa.int32()),      # the attempt the event belongs to, when it names one
    ("worker", pa.string()),
    ("run_at", TS),               # enqueued (the hash), retried and rescheduled (event)
    ("status", pa.string()),      # the status the event left, when it names it: waiting
                                  # (enqueued), ready or scheduled (unblocked)
    ("error", pa.string()),
    ("task_name", pa.string()),   # enqueued rows: from the job hash
    ("priority", pa.int32()),
    ("max_attempts", pa.int32()),
    ("started_at", TS),           # completed/failed/retried rows: the attempt's start
])
COLUMNS = tuple(ARROW_SCHEMA.names)
#: The Hive-style partition column (a directory ``date=YYYY-MM-DD``, the UTC day of the
#: entry's id): not stored in the files.
PARTITION = "date"


def day_of(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d")
