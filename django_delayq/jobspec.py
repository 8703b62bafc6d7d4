"""One job not sent yet (:class:`JobSpec`) and the other forms an item of
``Task.enqueue_many`` takes."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .task import Task

__all__ = ["JobSpec", "split_item"]


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
