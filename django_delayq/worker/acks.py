"""Sending the outcomes of finished jobs: every pending ack in one round trip."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..engine import Broker, ClaimedJob, QueueKeys
from .execution import Outcome


def by_shard(jobs: Iterable[ClaimedJob]) -> dict[QueueKeys, list[tuple[str, int]]]:
    """``(job id, attempt)`` pairs grouped by the shard holding each job."""
    grouped: dict[QueueKeys, list[tuple[str, int]]] = {}
    for job in jobs:
        grouped.setdefault(job.keys, []).append((job.id, job.attempt))
    return grouped


@dataclass(slots=True)
class SentAcks:
    """What became of a round trip of acks."""

    #: Acks the engine ignored: the lease had lapsed and another attempt owns the job.
    stale: int = 0
    #: Outcomes whose call failed (its shard refused it): to send again.
    unsent: list[Outcome] = field(default_factory=list)
    #: The first of those failures.
    error: Exception | None = None


def send_outcomes(broker: Broker, outcomes: Sequence[Outcome]) -> SentAcks:
    """Ack ``outcomes`` in one round trip: completions batched per shard, failures each.

    A call that fails (a Redis Cluster shard whose slot is moving answers TRYAGAIN) only
    leaves its own outcomes unsent; the others landed and are not sent twice. If the
    round trip itself fails, the Redis error propagates and nothing is known to have
    landed: the caller keeps every outcome to send again (an ack that did land is then
    ignored as stale, never applied twice).
    """
    batch = broker.batch()
    completes: dict[QueueKeys, list[Outcome]] = {}
    calls: list[tuple[int, list[Outcome]]] = []
    for o in outcomes:
        if o.ok:
            completes.setdefault(o.job.keys, []).append(o)
        else:
            calls.append((broker.add_fail(batch, o.job.keys, o.job.id, o.job.attempt,
                                          o.error, o.traceback, o.retry_delay_ms), [o]))
    for keys, done in completes.items():
        index = broker.add_complete(batch, keys,
                                    [(o.job.id, o.job.attempt, o.result_json) for o in done])
        calls.append((index, done))
    replies = batch.run(raise_on_error=False)
    sent = SentAcks()
    for index, sent_outcomes in calls:
        reply = replies[index]
        if isinstance(reply, Exception):
            sent.unsent += sent_outcomes
            sent.error = sent.error or reply
        elif sent_outcomes[0].ok:
            sent.stale += list(reply).count(0)
        elif reply[0] == "stale":
            sent.stale += 1
    return sent
