"""Django signals a worker sends around each attempt of a job, so error trackers (Sentry),
audit logs and metrics hook in without a middleware of their own (docs/observability.md).

Each is sent in the worker process, on the thread that runs the job (on the event loop,
through ``asend``, for an ``async def`` task), with ``sender`` the task's name and these
keyword arguments:

- ``job``: the :class:`~django_delayq.engine.ClaimedJob` (``id``, ``queue``, ``task``,
  ``attempt``, ``max_attempts``, ``args_json``...);
- ``worker``: the worker's name;
- after the attempt, ``outcome`` (``ok``, ``error``, ``traceback``, ``result_json``) and
  ``exception``, what the task raised (None when it succeeded).

``job_started`` before the task runs; then one of ``job_finished`` (it succeeded),
``job_retried`` (it failed and will run again) or ``job_failed`` (it failed for good).
The outcome is sent to Redis after the signal, so a receiver runs before the job is
marked finished there. What a receiver raises is logged, never the job's failure. With
no receiver connected a signal costs one attribute check.
"""

from __future__ import annotations

from django.dispatch import Signal

job_started = Signal()
job_finished = Signal()
job_retried = Signal()
job_failed = Signal()

__all__ = ["job_failed", "job_finished", "job_retried", "job_started"]
