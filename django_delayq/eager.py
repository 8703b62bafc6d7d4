"""Eager mode (``DELAYQ["EAGER"]``): a job runs in the enqueuing process, at enqueue.

For tests of code that enqueues. The job goes through what production does to it up to
Redis (the task's signature check, the options' checks, the JSON encoding with its size
limit) and what a worker does after (the JSON decoding of the arguments, the call with
``current_job()`` set, the JSON encoding of the result, retries up to ``max_attempts``,
at once), and nothing is sent to Redis. ``enqueue()`` returns the finished
:class:`~django_delayq.engine.job.Job`: ``status``, ``result``, ``error``,
``traceback``, ``attempts`` and ``progress`` are set; it is not in Redis, so
``refresh()`` and the other operations raise. An ``async def`` task runs to completion,
as :meth:`~django_delayq.Task.call` runs it.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import inspect
import json
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import async_to_sync

from .conf import conf
from .connection import get_broker
from .engine import Broker, ClaimedJob, EnqueueRequest, Job, Status
from .engine.codec import encode_result
from .engine.progress import ProgressReporter
from .runtime.current import running


class EagerProgress(ProgressReporter):
    """Progress of an eager job: kept on the job it returns, nothing written anywhere."""

    def __init__(self, job: ClaimedJob, broker: Broker) -> None:
        super().__init__(broker, job, interval=0)  # (its config only: _write sends nothing)
        self.fraction: float | None = None
        self.message = ""

    def _write(self, fraction: float, message: str) -> bool:
        self._pending = None
        self.fraction, self.message = fraction, message
        self.writes += 1
        return True


def run_to_end(func: Callable[..., Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Call ``func``; an ``async def`` one is run to completion through ``async_to_sync``.

    Called from a thread whose event loop is running (``enqueue()`` in async code), the
    coroutine cannot run on that loop until this call returns, so it runs on a loop of
    its own in another thread, with this context (``current_job()``); ``await
    aenqueue()`` spares the loop that wait.
    """
    if not inspect.iscoroutinefunction(func):
        return func(*args, **kwargs)
    runner = async_to_sync(func)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return runner(*args, **kwargs)
    context = contextvars.copy_context()
    with ThreadPoolExecutor(1, thread_name_prefix="delayq-eager") as pool:
        return pool.submit(context.run, runner, *args, **kwargs).result()


def run_eagerly(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                arg_names: Sequence[str]) -> Job:
    """Check, encode, decode and run one job of ``task`` (a :class:`~django_delayq.Task`,
    not imported here: it imports this module) now; the finished Job."""
    broker = get_broker()  # its checks only: no command is sent
    request = EnqueueRequest(task=task.name, args=args, kwargs=kwargs, run_at=task.run_at,
                             delay=task.delay, priority=task.priority, job_id=task.job_id,
                             max_attempts=task.attempts_allowed)
    encoded = broker.encode_request(request, arg_names)
    job_id, args_json, kwargs_json = encoded.job_id, encoded.args_json, encoded.kwargs_json
    now = dt.datetime.now(dt.UTC)
    job = Job(id=job_id, queue=task.queue_name, task_name=task.name, status=Status.ACTIVE,
              args=json.loads(args_json), kwargs=json.loads(kwargs_json),
              priority=task.priority, run_at=now, max_attempts=task.attempts_allowed,
              enqueued_at=now, worker="eager")
    for attempt in range(1, task.attempts_allowed + 1):
        started = dt.datetime.now(dt.UTC)
        claimed = ClaimedJob(
            keys=broker.keys_for(job.queue, job_id), id=job_id, task=task.name,
            args_json=args_json, kwargs_json=kwargs_json, attempt=attempt,
            max_attempts=task.attempts_allowed, priority=task.priority,
            run_at_ms=int(now.timestamp() * 1000), enqueued_at_ms=int(now.timestamp() * 1000),
            started_at_ms=int(started.timestamp() * 1000))
        job.attempts, job.started_at = attempt, started
        try:
            with running(claimed, "eager", None) as current:
                progress = current._progress = EagerProgress(claimed, broker)
                value = run_to_end(task.func, json.loads(args_json), json.loads(kwargs_json))
            result_json = encode_result(value, limit=broker.config.result_max_bytes)
        except Exception as exc:
            job.finished_at = dt.datetime.now(dt.UTC)
            job.error = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
            job.traceback = "".join(traceback.format_exception(exc))
            job.status, job.progress = Status.FAILED, progress.fraction
            job.progress_message = progress.message
            if attempt < task.attempts_allowed:
                continue
            if conf.EAGER == "propagate":
                raise
            return job
        job.status, job.result, job.error, job.traceback = (
            Status.COMPLETED, json.loads(result_json), None, None)
        job.finished_at = dt.datetime.now(dt.UTC)
        job.progress, job.progress_message = progress.fraction, progress.message
        return job
    return job
