"""The statuses of a job, and the groups of them the code asks about.

The values are the strings stored in the job hash (field ``s``), written by the Lua
scripts and mirrored by the model; :class:`Status` is a ``str`` so a status read from
Redis compares equal to its member.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class Status(StrEnum):
    """A job's status, in lifecycle order."""

    #: Waits for its parents (``depends_on``, chains, groups) before it is scheduled.
    WAITING = "waiting"
    SCHEDULED = "scheduled"
    READY = "ready"
    #: Leased to a worker and waiting in its buffer for a thread (in the active set).
    CLAIMED = "claimed"
    ACTIVE = "active"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


#: Every status a job can report, in lifecycle order.
JOB_STATUSES: Final = tuple(status.value for status in Status)
#: The statuses with a set of their own in each queue (``Queue.counts()`` counts
#: claimed jobs under active: both hold a lease).
STATUSES: Final = tuple(status.value for status in Status if status is not Status.CLAIMED)
#: Not started yet: such a job can be cancelled or rescheduled.
PENDING: Final = (Status.SCHEDULED, Status.READY)
#: Not started yet and may be cancelled (a waiting job too).
CANCELLABLE: Final = (Status.WAITING, Status.SCHEDULED, Status.READY)
#: Holding a lease (a worker runs it, or will): such a job is stopped by an abort.
LEASED: Final = (Status.CLAIMED, Status.ACTIVE)
#: Finished for good unless retried; listed newest first.
FINISHED: Final = (Status.COMPLETED, Status.FAILED, Status.CANCELLED)
#: The statuses of a job Redis must still hold (a finished one may expire).
UNFINISHED: Final = tuple(status for status in Status if status not in FINISHED)
#: Finished without success: such a job can be retried.
RETRYABLE: Final = (Status.FAILED, Status.CANCELLED)
#: A job written to the transactional outbox and not yet in Redis (no job hash holds it:
#: only ``OutboxJob`` and the Django Tasks backend report it).
OUTBOX: Final = "outbox"
#: Everything but a running job: what a queue's purge may remove.
PURGEABLE: Final = (Status.WAITING, Status.SCHEDULED, Status.READY, *FINISHED)
#: What a job's history (the mirrored table, the lake) says of a job purged from Redis
#: before it finished (no job hash holds it: Redis has no such status).
PURGED: Final = "purged"
#: Every status a job's history can report, in lifecycle order.
HISTORY_STATUSES: Final = (*JOB_STATUSES, PURGED)
#: Finished for good, in a job's history (a purged job too).
FINISHED_IN_HISTORY: Final = (*FINISHED, PURGED)
