"""The options of ``@task`` and ``Task.using()``, each named once, as typed keyword
arguments (PEP 692): what a caller may pass, checked by name at the call."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from .flow_control import KeySource


class _Options(TypedDict, total=False):
    """The options of a job that both ``@task`` and ``Task.using()`` set (see
    :class:`~django_delayq.task.Task`'s fields and docs/flow-control.md)."""

    queue: str | None
    priority: int | None
    delay: float | dt.timedelta | None
    max_attempts: int | None
    timeout: float | dt.timedelta | None
    concurrency_key: KeySource | None
    concurrency_limit: int | None
    key_rate_limit: str | None
    key_weight: int | None


class TaskOptions(_Options, total=False):
    """The keyword arguments of :func:`~django_delayq.task.task`."""

    name: str | None
    retry_backoff: float | None
    retry_backoff_max: float | None
    cron: str | None
    tz: str | None
    every: float | dt.timedelta | None


class EnqueueOptions(_Options, total=False):
    """The keyword arguments of :meth:`~django_delayq.task.Task.using`."""

    run_at: dt.datetime | None
    job_id: str | None
    database: str | None
    depends_on: Iterable[Any] | None
    on_parent_failure: str | None
    pass_results: str | None
    dedupe_key: KeySource | None
    dedupe: str | None
    dedupe_window: float | dt.timedelta | None


#: The options of ``Task.using()`` that make its :class:`FlowControl`.
FLOW_OPTIONS = ("concurrency_key", "concurrency_limit", "dedupe_key", "dedupe",
                "dedupe_window", "key_rate_limit", "key_weight")


def given_options(given: Mapping[str, Any], known: type, where: str) -> dict[str, Any]:
    """The options ``given`` to ``where``, the ones set to None left out; ``TypeError``
    for a name ``known`` (a TypedDict) does not declare, as for an unexpected keyword
    argument."""
    unknown = sorted(set(given) - known.__optional_keys__)  # type: ignore[attr-defined]
    if unknown:
        raise TypeError(f"{where} got unexpected keyword arguments: {', '.join(unknown)}")
    return {key: value for key, value in given.items() if value is not None}
