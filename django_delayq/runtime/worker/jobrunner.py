"""What a worker's two ways of running jobs, its threads (:mod:`.executor`) and its
event loop (:mod:`.async_executor`), are both given."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...engine import Broker, ClaimedJob
from ..registry import TaskRegistry
from .ledger import Ledger
from .middleware import Middleware
from .outcome import Outcome
from .timelimits import HARD_LIMIT_GRACE


@dataclass(kw_only=True, eq=False)
class JobRunner:
    """Where to look tasks up, the leases, where outcomes and start notes go, and the
    time limit of jobs that set none."""

    tasks: TaskRegistry
    #: The worker's name, as its records and its jobs' leases give it.
    name: str
    broker: Broker
    middleware: Sequence[Middleware]
    ledger: Ledger
    #: Takes each job's outcome (the acker's ``put``).
    report: Callable[[Outcome], None]
    #: Takes ``(job, start ms)`` as a job starts (sent with the next acks).
    note_started: Callable[[ClaimedJob, int], None]
    #: Time limit of jobs that set none (their task neither), seconds.
    timeout: float | None = None
    timeout_grace: float = HARD_LIMIT_GRACE
    #: Called as each job ends, before the fetcher hears of the free slot (the process
    #: pool's recycling counts jobs with it).
    after_job: Callable[[], None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.middleware = list(self.middleware)  # the caller's list may change later
