"""Exceptions raised by django-delayq. All derive from :class:`DelayQError`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from .logfields import log

if TYPE_CHECKING:
    from .claims import ClaimResult


class DelayQError(Exception):
    """Base class of every django-delayq error."""


class ExtraMissing(DelayQError, ImportError):
    """An optional dependency is not installed: the message says which extra of
    django-delayq brings it."""

    def __init__(self, what: str, needs: str, extra: str, note: str = "") -> None:
        super().__init__(f"{what} needs {needs}: pip install 'django-delayq[{extra}]'{note}")


class DelayQConnectionError(DelayQError, ConnectionError):
    """Redis could not be reached (or answered too slowly) for a queue operation."""


class CommandRefused(DelayQError, RedisError):
    """Redis answered a read with an error instead of serving it: an ACL without the
    command, a key of another type (written by hand). Trying again changes nothing.

    Also a ``RedisError``, which redis-py raised in its place before, so that code
    catching those still catches it. The message starts with redis-py's error class.
    """

    def __init__(self, error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")


class NotReplicated(DelayQError):
    """Fewer replicas than ``MIN_REPLICAS`` confirmed a write within the timeout.

    The write reached the primary (an enqueue: the job exists there and runs unless
    that primary fails before a replica copies it); if the primary fails over first,
    the job may or may not survive. Enqueuing the same job ids again is safe: an
    existing id is not added twice.
    """

    def __init__(self, job_ids: list[str], confirmed: int, wanted: int,
                 timeout_ms: int) -> None:
        self.job_ids = job_ids
        self.confirmed = confirmed
        self.wanted = wanted
        shown = ", ".join(job_ids[:5]) + (f" and {len(job_ids) - 5} more"
                                          if len(job_ids) > 5 else "")
        super().__init__(
            f"{len(job_ids)} job(s) ({shown}) written to the Redis primary, but only "
            f"{confirmed} of the {wanted} replica(s) required (MIN_REPLICAS) confirmed "
            f"them within {timeout_ms} ms: they may or may not survive a failover. "
            f"Enqueuing the same job ids again is safe (an existing id is not added twice).")


class JobNotFound(DelayQError, LookupError):
    """No job with this id exists in this queue (never enqueued, or expired)."""


class InvalidJobState(DelayQError):
    """The job's status does not allow the operation (cancelling a running job, say).

    The reason is data: ``job_id``, its ``status``, the ``operation`` refused and the
    statuses it ``allowed``; :attr:`reason` says it in words, without the job id.
    """

    def __init__(self, job_id: str, status: str, operation: str,
                 allowed: Sequence[str]) -> None:
        self.job_id, self.status, self.operation = job_id, status, operation
        self.allowed = tuple(allowed)
        super().__init__(f"job {job_id!r} is {self.reason}")

    @property
    def reason(self) -> str:
        """e.g. ``"active: only a scheduled or ready job can be cancelled"``."""
        names = [str(status) for status in self.allowed]
        either = " or ".join(names) if len(names) < 3 else (
            f"{', '.join(names[:-1])} or {names[-1]}")
        return f"{self.status}: only a {either} job can be {self.operation}"


class PayloadTooLarge(DelayQError, ValueError):
    """The encoded arguments of a job exceed the configured size limit."""


class ResultTooLarge(DelayQError, ValueError):
    """A job's error, never raised to a caller: its task returned a value whose JSON is
    over ``RESULT_MAX_BYTES``; the job fails (not retried) and the value is not kept."""


class AckRefused(DelayQError):
    """A job's error, never raised to a caller: Redis refused its ack (the result,
    error or traceback over what the server takes, e.g. ``proto-max-bulk-len``, or a
    value it cannot take) while it answered the worker; the job fails without them, and
    the other jobs' acks go on."""


class UnknownTask(DelayQError, LookupError):
    """No task with this name is registered."""


class LeaseExpired(DelayQError):
    """A job's error, never raised: its worker stopped renewing its lease (it died, froze
    or was killed) and no attempt was left. ``reclaim.lua`` records it by this name."""


class WorkerLost(DelayQError):
    """A job's error, never raised: the worker process that held it ended (killed by its
    host past a hard time limit or frozen, crashed, or exited by itself) and its host
    handed the job back at once. ``reclaim.lua`` records it by this name."""


class DamagedJob(DelayQError):
    """A job's error, never raised: its stored record was not a job hash (written by
    hand) and could not be run. ``claim.lua`` records it by this name."""


class DependencyFailed(DelayQError):
    """A job's error, never raised: a parent it depends on failed or was cancelled, so
    it never ran. ``flows.lua`` records it by this name."""


class JobTimeout(BaseException):
    """Raised inside a job's thread when the job overruns its time limit.

    A ``BaseException`` (like ``KeyboardInterrupt``), so that a task's ``except
    Exception`` does not swallow it by accident. A job that has not returned a grace
    period later is failed with this error all the same (see docs/guarantees.md).
    """

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or ("the job ran past its time limit",)))


class JobAborted(JobTimeout):
    """Raised inside a job's thread when its abort was asked for (``Job.abort()``), as
    :class:`JobTimeout` is at a time limit (whose rules it follows: a job still running a
    grace period later has its worker process replaced). The job ends ``cancelled``."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(args or ("the job was aborted",)))


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


#: Damaged records already logged by :func:`warn_once` (bounded: cleared when full).
_WARNED: set[str] = set()
_WARNED_MAX = 10_000


def warn_once(logger: logging.Logger, key: str, event: str, /, **fields: Any) -> None:
    """Log ``event`` with ``fields`` at WARNING the first time this process meets ``key``
    (a damaged record, a bad name): each is named once, not on every read of it."""
    if key in _WARNED:
        return
    if len(_WARNED) >= _WARNED_MAX:
        _WARNED.clear()
    _WARNED.add(key)
    log(logger, logging.WARNING, event, **fields)

