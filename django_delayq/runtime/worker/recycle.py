"""Recycling: a worker process that has run enough jobs, or grown too big, stops warmly.

``runworker --max-jobs-per-child N`` and ``--max-memory-per-child MiB`` attach a
:class:`RecycleMonitor` to the :class:`~django_delayq.worker.Worker`. A process that
recycles after N jobs claims N jobs in all (its claim budget), so it runs exactly N;
the last one ending asks the worker to recycle
(:meth:`~django_delayq.worker.Worker.request_recycle`). The memory limit is looked at
after each job: past it, the worker claims nothing more, hands back the claimed jobs
that have not started (unattempted) and lets the running ones finish, however long they
take (a job's time limit plus its grace still bounds it, when it has one). The process
then exits with :data:`EXIT_RECYCLE`, which its host answers by starting a fresh process
at once. Nothing is lost and the recycle runs no job twice. A stop signal during the
wait is a first signal: the grace period then applies, from the signal.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
import threading
import time

from ...engine.logfields import log
from .exit_codes import EXIT_RESTART
from .runner import Worker

logger = logging.getLogger("django_delayq.worker")

#: Exit code of a worker process that stopped to be recycled (sysexits' EX_TEMPFAIL).
EXIT_RECYCLE = EXIT_RESTART  # "restart me" (worker/exit_codes.py)
#: Seconds between two reads of the resident memory (one read per job at most).
MEMORY_CHECK_INTERVAL = 0.1
MIB = 1024 * 1024


def rss_bytes() -> int:
    """This process's resident set size now (Linux: /proc/self/statm), in bytes.

    Where /proc is missing, the peak RSS from ``getrusage`` (it never goes down, so a
    process recycles once it has ever been that big).
    """
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class RecycleMonitor:
    """Stops ``worker`` once it has finished ``max_jobs`` jobs or uses ``max_memory_mib``.

    A job counts when it ends (whatever its outcome). The worker claims ``max_jobs``
    jobs in all (its ledger's claim budget), so it runs no more than that: the last
    one ending is the recycle. A memory recycle lets the jobs in hand finish.
    """

    def __init__(self, worker: Worker, *, max_jobs: int | None = None,
                 max_memory_mib: float | None = None) -> None:
        self.worker = worker
        self.max_jobs = max_jobs
        self.max_memory = None if max_memory_mib is None else int(max_memory_mib * MIB)
        self.jobs = 0
        self.reason: str | None = None  # why it recycled; None while it has not
        self._lock = threading.Lock()
        self._next_memory_check = 0.0
        worker.ledger.budget = max_jobs
        worker.after_job = self.job_done

    def job_done(self) -> None:
        """After each job (on the executor thread that ran it)."""
        with self._lock:
            self.jobs += 1
            if self.reason is not None:
                return
            reason = self.check()
            if reason is None:
                return
            self.reason = reason
        log(logger, logging.INFO, "recycling worker process", pid=os.getpid(), reason=reason,
            worker=self.worker.name)
        self.worker.request_recycle()

    def check(self) -> str | None:
        """The limit reached now, as a log-friendly reason, or None."""
        if self.max_jobs is not None and self.jobs >= self.max_jobs:
            return f"jobs={self.jobs} max_jobs={self.max_jobs}"
        now = time.monotonic()
        if self.max_memory is not None and now >= self._next_memory_check:
            self._next_memory_check = now + MEMORY_CHECK_INTERVAL
            rss = rss_bytes()
            if rss >= self.max_memory:
                return f"rss_mib={rss / MIB:.0f} max_memory_mib={self.max_memory / MIB:.0f}"
        return None
