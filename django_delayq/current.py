"""``current_job()``: the job the current thread runs on a worker (``None`` elsewhere).

The public home of :mod:`django_delayq.runtime.current`, where the worker sets it.
"""

from .runtime.current import RunningJob, current_job

__all__ = ["RunningJob", "current_job"]
