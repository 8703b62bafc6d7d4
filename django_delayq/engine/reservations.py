"""Start reservations: rate limits of sharded queues on a Redis Cluster.

A queue's start window (``QueueKeys.limit`` of its unsharded keys) sits in another
cluster slot than its shards, and a script cannot touch two slots. So a claim on such a
queue reserves starts in the window first (``reserve.lua``), claims at most that many
jobs from the shards one at a time, then settles: used starts move to the time the
shard's claim made them, unused ones go back. See docs/flow-control.md for the
trade-offs. On one Redis, or for an unsharded queue, the claim script counts starts in
the window itself and none of this runs.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

from .claims import ClaimResult
from .core import BrokerCore
from .errors import PartialClaimError
from .failover import CALL_FAILED
from .keys import QueueKeys


def reserve(broker: BrokerCore, queue: str, want: int, token: str) -> tuple[int, int | None]:
    """Take up to ``want`` starts from the window of ``queue`` (one round trip).

    Returns (granted, ms until the next start is allowed or None). The caller then
    settles the reservation with :func:`settle`.
    """
    limit = broker.rate_limit(queue)
    if limit is None:
        return want, None
    granted, wait = broker.commands.reserve(broker.limit_key(queue), want, limit.limit,
                                            limit.period_ms, token)
    return granted, None if wait < 0 else wait


def settle(broker: BrokerCore, queue: str, token: str, granted: int,
           started: Sequence[int]) -> None:
    """Settle a reservation (one round trip): the i-th start used happened at
    ``started[i]`` (ms, later than the reservation), the rest are given back.

    Moving each used entry to its real start time keeps the window exact: a start a
    shard's claim made a few ms after the reservation leaves the window that much later.
    """
    if not granted:
        return
    key = broker.limit_key(queue)
    pipe = broker.client.pipeline(transaction=False)
    if started:
        pipe.zadd(key, {f"{token}:{i}": at for i, at in enumerate(started, 1)}, xx=True,
                  gt=True)
    if len(started) < granted:
        pipe.zrem(key, *(f"{token}:{i}" for i in range(len(started) + 1, granted + 1)))
    pipe.execute()


def claim_reserved(
    broker: BrokerCore, queue: str, shards: Sequence[QueueKeys], count: int, worker: str,
    lease_ms: int | None = None,
) -> list[ClaimResult]:
    """Reserve up to ``count`` starts of ``queue``, then claim them from ``shards`` in
    order, one shard (one round trip) at a time, and settle.

    The first result carries the reservation's wait when the window is full.
    """
    token = f"{worker}:{secrets.token_urlsafe(9)}"
    granted, wait = reserve(broker, queue, count, token)
    results: list[ClaimResult] = []
    if not granted:
        # Nothing may start: still promote due jobs and learn the next due time.
        batch = broker.batch()
        for keys in shards:
            broker.add_claim(batch, keys, 0, worker, lease_ms, reserved=True)
        results = broker.run_claims(batch, shards)
    else:
        started: list[int] = []
        try:
            for keys in shards:
                batch = broker.batch()
                broker.add_claim(batch, keys, granted - len(started), worker, lease_ms,
                                 reserved=True)
                try:
                    (result,) = broker.run_claims(batch, [keys])
                except CALL_FAILED as exc:
                    if results:  # never drop the answers (and jobs) already in hand
                        raise PartialClaimError(results, 1) from exc
                    raise
                started += [result.now_ms] * len(result.jobs)
                results.append(result)
                if len(started) >= granted:
                    break
        finally:
            settle(broker, queue, token, granted, started)
    if results and wait is not None:
        results[0].limit_wait_ms = wait
    return results
