"""What a claim returns: the jobs leased to a worker, per queue shard.

Kept apart from the broker so the errors (:class:`~django_delayq.engine.errors.PartialClaimError`
holds claim results) and the reservations read them without importing the broker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .keys import QueueKeys

#: Values before the jobs in the claim script's reply, and per job (see lua/claim.lua).
CLAIM_HEADER = 6
CLAIM_FIELDS = 11


@dataclass(slots=True)
class ClaimedJob:
    """A job leased to a worker. ``attempt`` is the lease token for its ack."""

    keys: QueueKeys
    id: str
    task: str
    args_json: str
    kwargs_json: str
    attempt: int
    max_attempts: int
    priority: int
    run_at_ms: int
    enqueued_at_ms: int
    started_at_ms: int
    #: The job's own time limit per attempt, ms (0: none set on the job).
    timeout_ms: int = 0
    #: The W3C ``traceparent`` stored with the job at its enqueue ('' for none).
    traceparent: str = ""

    @property
    def queue(self) -> str:
        return self.keys.queue


@dataclass(slots=True)
class ClaimResult:
    """The answer of one claim call on one queue shard."""

    keys: QueueKeys
    now_ms: int
    next_due_ms: int | None
    paused: bool
    orphans: int
    jobs: list[ClaimedJob]
    #: ms until the queue's start-rate window lets another job start (None: not limited).
    limit_wait_ms: int | None = None
    #: µs from ``now_ms`` (to the microsecond) until ``next_due_ms`` (None: none due).
    due_in_us: int | None = None


def parse_claim(keys: QueueKeys, reply: list[Any]) -> ClaimResult:
    """The claim script's reply for the shard ``keys``, parsed."""
    now, next_due, paused, orphans, limit_wait, due_in = (
        int(x) for x in reply[:CLAIM_HEADER])
    jobs = [
        ClaimedJob(keys, reply[i], reply[i + 1], reply[i + 2], reply[i + 3],
                   int(reply[i + 4]), int(reply[i + 5]), int(reply[i + 6]),
                   int(reply[i + 7]), int(reply[i + 8]), now, int(reply[i + 9]), reply[i + 10])
        for i in range(CLAIM_HEADER, len(reply), CLAIM_FIELDS)
    ]
    return ClaimResult(keys, now, None if next_due < 0 else next_due, bool(paused), orphans,
                       jobs, None if limit_wait < 0 else limit_wait,
                       None if due_in < 0 else due_in)
