"""Exceptions raised by django-delayq. All derive from :class:`DelayQError`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from redis.exceptions import RedisError

if TYPE_CHECKING:
    from .broker import ClaimResult


class DelayQError(Exception):
    """Base class of every django-delayq error."""


class DelayQConnectionError(DelayQError, ConnectionError):
    """Redis could not be reached (or answered too slowly) for a queue operation."""


class JobNotFound(DelayQError, LookupError):
    """No job with this id exists in this queue (never enqueued, or expired)."""


class InvalidJobState(DelayQError):
    """The job's status does not allow the operation (cancelling a running job, say)."""


class PayloadTooLarge(DelayQError, ValueError):
    """The encoded arguments of a job exceed the configured size limit."""


class UnknownTask(DelayQError, LookupError):
    """No task with this name is registered."""


class PartialClaimError(DelayQError, RedisError):
    """A claim over several shards failed on some of them and not on the others.

    ``results`` holds the answers of the others: their jobs are leased to the caller,
    who should run them (or release them) rather than let the leases lapse. The first
    failure is the ``__cause__``; a Redis Cluster answers ``TRYAGAIN`` for a shard
    whose slot is moving to another node, for example.
    """

    def __init__(self, results: list[ClaimResult], failed: int) -> None:
        self.results = results
        self.failed = failed
        leased = sum(len(r.jobs) for r in results)
        super().__init__(f"the claim failed on {failed} shard(s); {leased} job(s) leased "
                         "from the others are in .results")
