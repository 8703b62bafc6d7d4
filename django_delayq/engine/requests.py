"""What a producer hands the broker and gets back: a job to enqueue, what Redis said
about it, the totals of a bulk call, and new job ids."""

from __future__ import annotations

import os
from base64 import urlsafe_b64encode
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from .keyed import KeyedOptions, Outcome

ID_BYTES = 12
ID_CHARS = 16


def new_job_id() -> str:
    """A random job id: 96 bits in 16 URL-safe characters (short ids save Redis memory)."""
    return urlsafe_b64encode(os.urandom(ID_BYTES)).decode()


def new_job_ids(batch: int) -> Iterator[str]:
    """Endless job ids like :func:`new_job_id`'s, ``batch`` from each ``os.urandom`` call."""
    while True:
        # 12 bytes are exactly 16 base64 characters, so one encoding slices into ids.
        text = urlsafe_b64encode(os.urandom(ID_BYTES * batch)).decode()
        yield from (text[i:i + ID_CHARS] for i in range(0, len(text), ID_CHARS))


@dataclass(slots=True, kw_only=True)
class EnqueueRequest:
    """One job to enqueue with :meth:`Broker.enqueue_many`."""

    task: str
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    run_at: Any = None
    delay: Any = None
    priority: int = 0
    job_id: str | None = None
    max_attempts: int = 1
    #: Time limit of each attempt (seconds or a timedelta); None: the worker's default.
    timeout: Any = None
    #: Parents to wait for (jobs, job ids of this queue, or (queue, id) pairs): see
    #: :mod:`~django_delayq.engine.flows`.
    depends_on: Sequence[Any] | None = None
    on_parent_failure: str = "cancel"
    #: '' (nothing), 'one' or 'all' of the parents' results, as the first argument.
    pass_results: str = ""
    #: Concurrency and dedupe keys (:func:`.keyed.encode` checks and builds them).
    keyed: KeyedOptions | None = None
    #: W3C trace context of the code that enqueues ('' for none), stored with the job.
    traceparent: str = ""


@dataclass(slots=True)
class EnqueueResult:
    """What Redis said about one enqueued job."""

    job_id: str
    added: bool
    status: str
    run_at_ms: int
    enqueued_at_ms: int
    #: What the enqueue did (with a dedupe key: replaced or ignored, ``job_id`` then
    #: being the job that stands for the key).
    outcome: Outcome = Outcome.CREATED


@dataclass(slots=True)
class BulkResult:
    """Totals of :meth:`Broker.enqueue_many`."""

    enqueued: int = 0
    duplicates: int = 0
    #: The id of every job Redis took (added or a duplicate), in call order.
    job_ids: list[str] = field(default_factory=list)
    #: Ids that were not added because a job with that id exists (or came earlier).
    duplicate_ids: list[str] = field(default_factory=list)
    #: Jobs of a dedupe key whose waiting job took their arguments instead ("debounce",
    #: "keep_last"), and jobs a "throttle" window ignored; ``job_ids`` holds the id of
    #: the job in effect for each.
    replaced: int = 0
    ignored: int = 0
    #: Round trips to Redis (one per chunk).
    chunks: int = 0
