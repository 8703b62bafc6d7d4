"""Sending the outcomes of finished jobs: every pending ack in one round trip."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..engine import Broker, ClaimedJob, QueueKeys
from .execution import Outcome


def by_shard(jobs: Iterable[ClaimedJob]) -> dict[QueueKeys, list[tuple[str, int]]]:
    """``(job id, attempt)`` pairs grouped by the shard holding each job."""
    grouped: dict[QueueKeys, list[tuple[str, int]]] = {}
    for job in jobs:
        grouped.setdefault(job.keys, []).append((job.id, job.attempt))
    return grouped


def send_outcomes(broker: Broker, outcomes: Sequence[Outcome]) -> int:
    """Ack ``outcomes`` in one round trip: completions batched per shard, failures each.

    Returns how many acks were stale (the lease had lapsed and another attempt owns the
    job: the engine ignored them). Redis errors propagate; nothing is lost by them, as
    the caller keeps the outcomes to send again.
    """
    batch = broker.batch()
    completes: dict[QueueKeys, list[tuple[str, int, str]]] = {}
    fail_calls: list[int] = []
    for o in outcomes:
        if o.ok:
            completes.setdefault(o.job.keys, []).append((o.job.id, o.job.attempt,
                                                         o.result_json))
        else:
            fail_calls.append(broker.add_fail(batch, o.job.keys, o.job.id, o.job.attempt,
                                              o.error, o.traceback, o.retry_delay_ms))
    complete_calls = [broker.add_complete(batch, keys, done) for keys, done in completes.items()]
    replies = batch.run()
    stale = sum(1 for i in fail_calls if replies[i][0] == "stale")
    return stale + sum(list(replies[i]).count(0) for i in complete_calls)
