"""Running one job: resolve its task in the registry, decode, call, encode the result.

Everything that can go wrong with a job ends in an :class:`~.outcome.Outcome`, never in
an exception that would stop the thread running it: whatever the task raises
(``BaseException`` included: ``SystemExit``, ``KeyboardInterrupt``, a library's own
subclass, an exception whose ``__str__`` raises) fails the job with its class, a
message and the traceback, retried or dead-lettered by the usual rules.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence

from ...engine import Broker, ClaimedJob, JobAborted, UnknownTask, encode_result
from ...engine.logfields import log
from ..current import running
from ..registry import TaskRegistry
from .ledger import Ledger
from .middleware import Middleware
from .outcome import CorruptPayload, Outcome, decode_arguments, describe, failure

logger = logging.getLogger("django_delayq.worker")


def execute(job: ClaimedJob, tasks: TaskRegistry, worker: str, broker: Broker,
            middleware: Sequence[Middleware], *, idle: bool,
            on_finished: list[Callable[[Outcome], None]] | None = None,
            abort_by: Callable[[], str | None] | None = None) -> Outcome:
    """Run ``job`` between its ``middleware``'s hooks. What the task adds to its
    ``on_finished`` hooks goes to ``on_finished``: the caller calls them
    (:func:`finished`) once the outcome is final.

    An unknown task and an exception of the task are retried (while attempts remain);
    undecodable data and a return value that is not JSON are not; a hook that raises
    before the job fails it (retried).
    """
    hooks = [] if on_finished is None else on_finished
    if abort_by is not None and abort_by() is not None:  # asked to stop before it ran
        return failure(job, JobAborted(f"aborted by {abort_by()}"), retry=False)
    try:
        for each in middleware:
            each.before_job(job, idle=idle)
    except BaseException as exc:  # the job did not run: retried
        outcome = failure(job, exc, retry=True)
    else:
        outcome = _run(job, tasks, worker, broker, hooks, abort_by)
    if abort_by is not None:  # the middleware (signals, traces) sees what the job became
        outcome = aborted(abort_by(), outcome)
    for each in reversed(middleware):
        try:
            each.after_job(job, outcome)
        except BaseException:
            log(logger, logging.ERROR, "middleware failed after the job", exc_info=True,
                job=job.id, queue=job.queue, task=job.task)
    return outcome


def _run(job: ClaimedJob, tasks: TaskRegistry, worker: str, broker: Broker,
         on_finished: list[Callable[[Outcome], None]],
         abort_by: Callable[[], str | None] | None) -> Outcome:
    if not job.task:
        return failure(job, CorruptPayload("the job has no task name"), retry=False)
    try:
        task = tasks.get(job.task)
    except UnknownTask as exc:
        return failure(job, exc, retry=True)
    try:
        args, kwargs = decode_arguments(job)
    except CorruptPayload as exc:
        return failure(job, exc, retry=False)
    pid = os.getpid()
    with running(job, worker, broker, on_finished, abort_by):
        try:
            value = task.func(*args, **kwargs)
        except BaseException as exc:  # every failure of a task is the job's
            end_a_fork(pid, exc)
            return failure(job, exc, retry=True, delay=task.retry_delay(job.attempt))
        end_a_fork(pid)
    try:
        result_json = encode_result(value, limit=broker.config.result_max_bytes)
    except BaseException as exc:  # a value whose encoding raises anything
        return failure(job, exc, retry=False)
    return Outcome(job, True, result_json=result_json)


def end_a_fork(pid: int, exc: BaseException | None = None) -> None:
    """End this process if it is not ``pid`` but a child a task forked that came back
    here (returned, or raised, ``SystemExit`` included) instead of ending itself: as a
    copy of the worker it would run the worker's buffered jobs again, and live on after
    the worker stopped. It exits as a script would: 0, or ``SystemExit``'s code, or 1."""
    if os.getpid() == pid:
        return
    code = 0 if exc is None else 1
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    os._exit(code)  # no flush: the buffers hold the worker's output, copied at the fork


#: How the errors of a job stopped by its abort begin: JobAborted raised in it, or its
#: task cancelled on the loop.
_STOPPED = (describe(JobAborted()).split(":")[0], "asyncio.exceptions.CancelledError",
            "builtins.GeneratorExit")


def aborted(abort_by: str | None, outcome: Outcome) -> Outcome:
    """The outcome of a job whose abort ``abort_by`` asked for (None: nobody did): one
    that returned (it checked ``abort_requested``) or was stopped by the abort fails with
    :class:`JobAborted` naming who asked, never retried (the engine makes it
    ``cancelled``); a failure of its own stands. Applying it twice changes nothing."""
    if abort_by is None:
        return outcome
    if outcome.ok:
        return failure(outcome.job, JobAborted(f"aborted by {abort_by}"), retry=False)
    if outcome.error.startswith(_STOPPED):
        outcome.error = describe(JobAborted(f"aborted by {abort_by}"))
    outcome.retry_delay_ms = -1
    return outcome


def finished(hooks: list[Callable[[Outcome], None]], outcome: Outcome) -> None:
    """Call (and forget) a job's ``on_finished`` hooks with its final ``outcome``, once.

    A hook that raises, ``BaseException`` included (a ``task_finished`` receiver calling
    ``sys.exit()``), is logged and the next one called: the outcome is the job's, and the
    worker goes on.
    """
    while hooks:
        hook = hooks.pop(0)
        try:
            hook(outcome)
        except BaseException:
            log(logger, logging.ERROR, "on_finished hook failed", exc_info=True,
                job=outcome.job.id, queue=outcome.job.queue, task=outcome.job.task)


def after_job(hook: Callable[[], None] | None, job: ClaimedJob) -> None:
    """Call a worker's after-job hook (recycling counts jobs with it); what it raises is
    logged, so the job's outcome is reported all the same."""
    if hook is None:
        return
    try:
        hook()
    except BaseException:
        log(logger, logging.ERROR, "after-job hook failed", exc_info=True, job=job.id,
            queue=job.queue, task=job.task)



def fail_held(ledger: Ledger, report: Callable[[Outcome], None], job: ClaimedJob,
              exc: BaseException) -> bool:
    """Fail ``job`` (retried while attempts remain) when what runs it raised outside the
    task (a fault of the worker, not of the job) while its lease was still buffered or
    running: held with no outcome, it would be renewed for ever and its slot lost.
    Returns whether the job was still held so. Its place in the claim budget is given
    back: the recycle counts the jobs its after-job hook saw, and this one it never will
    (kept, the worker would claim its last place and never reach its count)."""
    lease = ledger.abandon(job, buffered=True)
    if lease is None:
        return False
    with ledger.lock:
        ledger.refund(1)
    log(logger, logging.ERROR, "job run failed outside its task, failing it", job=job.id,
        queue=job.queue, task=job.task, error=describe(exc))
    outcome = failure(job, exc, retry=True)
    if lease.began:
        outcome.started_ms = lease.started_ms
        outcome.finished_ms = lease.started_ms + int((time.monotonic() - lease.began) * 1000)
    report(outcome)
    finished(lease.on_finished, outcome)  # hooks its task added, if it got that far
    return True
