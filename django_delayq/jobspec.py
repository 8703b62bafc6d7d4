"""``JobSpec``: one job not sent yet (``Task.bind()``, the items of ``enqueue_many``, the
steps of ``chain`` and ``group``), and the requests a bulk enqueue of a task sends."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .engine import EnqueueRequest

if TYPE_CHECKING:
    from .task import Task

__all__ = ["JobSpec", "requests_of", "split_item"]


@dataclasses.dataclass(frozen=True, slots=True)
class JobSpec:
    """One job to enqueue, not sent yet: arguments and per-job options. ``Task.bind()``
    makes one; :meth:`Task.enqueue_many`, :func:`~django_delayq.chain` and
    :func:`~django_delayq.group` take them.

    Options left as None fall back to the task's. ``run_at`` and ``delay`` exclude each
    other.
    """

    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    job_id: str | None = None
    run_at: dt.datetime | None = None
    delay: float | dt.timedelta | None = None
    priority: int | None = None
    max_attempts: int | None = None
    #: The task ``Task.bind`` made this spec of (workflows need it; ``enqueue_many`` runs
    #: its own task).
    task: Task[Any, Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.args, str | bytes) or not isinstance(self.args, Sequence):
            raise TypeError(
                f"JobSpec args must be a list or tuple, not {type(self.args).__name__}")
        if not isinstance(self.kwargs, Mapping):
            raise TypeError(
                f"JobSpec kwargs must be a mapping, not {type(self.kwargs).__name__}")
        if self.run_at is not None and self.delay is not None:
            raise ValueError("give run_at or delay, not both")


def split_item(item: Any) -> tuple[Sequence[Any], dict[str, Any]]:
    """``(args, kwargs)`` of an item of ``enqueue_many`` that is not a :class:`JobSpec`:
    positional arguments, keyword arguments, or an ``(args, kwargs)`` pair."""
    kind = type(item)
    if kind is list or (kind is tuple and len(item) != 2):  # the common case, no abc check
        return item, {}
    if kind is dict:
        return (), dict(item)
    if isinstance(item, Mapping):
        return (), dict(item)
    if (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], Mapping)
            and isinstance(item[0], list | tuple)):
        return item[0], dict(item[1])
    if isinstance(item, list | tuple):
        return item, {}
    raise TypeError(f"enqueue_many items are argument sequences, keyword mappings or "
                    f"(args, kwargs) pairs, not {type(item).__name__}")


def requests_of(task: Task[Any, Any], jobs: Iterable[Any]) -> Iterator[EnqueueRequest]:
    """The request of each item of :meth:`Task.enqueue_many`, its arguments checked, its
    flow-control keys resolved."""
    for request in _plain_requests(task, jobs):
        if task.flow:
            request.keyed, job_id, delay = task.flow.resolve(request.args, request.kwargs)
            request.job_id = job_id or request.job_id
            if delay is not None:  # debounce: the window from now, as enqueue() does
                request.run_at, request.delay = None, delay
        yield request


def _plain_requests(task: Task[Any, Any], jobs: Iterable[Any]) -> Iterator[EnqueueRequest]:
    attempts = task.attempts_allowed
    for index, item in enumerate(jobs):
        if isinstance(item, JobSpec):
            args, kwargs = item.args, dict(item.kwargs)
        else:
            args, kwargs = split_item(item)
        try:
            task.check_arguments(args, kwargs)
        except TypeError as exc:
            raise TypeError(f"item {index}: {exc}") from None
        if not isinstance(item, JobSpec):
            yield EnqueueRequest(task=task.name, args=args, kwargs=kwargs,
                                 run_at=task.run_at, delay=task.delay,
                                 priority=task.priority, max_attempts=attempts,
                                 timeout=task.timeout)
            continue
        run_at, delay = task.run_at, task.delay
        if item.run_at is not None or item.delay is not None:
            run_at, delay = item.run_at, item.delay
        yield EnqueueRequest(
            task=task.name, args=args, kwargs=kwargs, run_at=run_at, delay=delay,
            job_id=item.job_id,
            priority=task.priority if item.priority is None else item.priority,
            max_attempts=item.max_attempts or attempts, timeout=task.timeout,
        )
