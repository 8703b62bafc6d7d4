"""OpenTelemetry traces (the ``otel`` extra): a span for each enqueue and one for each
attempt, in one trace through the W3C ``traceparent`` stored with the job.

The enqueue span (kind PRODUCER, named ``send <queue>``) is current while the job is
sent, and its context is the job's ``traceparent`` (field ``tp`` of the job hash). A
worker starts each attempt's span (kind CONSUMER, ``process <queue>``) as a child of it,
current while the task runs, so the spans the task makes (a database query, an HTTP
call) join the trace of the request that enqueued the job. The attributes follow
OpenTelemetry's semantic conventions for messaging (``messaging.system``,
``messaging.operation.type``, ``messaging.destination.name``, ``messaging.message.id``)
plus the job's task and attempt.

Without opentelemetry installed :data:`ENABLED` is False: no span, no middleware, no
stored field; producers test the flag before anything else, so tracing costs nothing.
With it installed but no tracer provider set, no span is made either (the API's no-op
spans would record nothing, and cost a worker a quarter of its time per short job): a
context already current (a traced request upstream) still gives its ``traceparent`` to
the jobs sent in it, and a worker makes a job's stored one current while it runs, so
that what the task sends stays in that trace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ..engine import ClaimedJob
from .worker.middleware import Middleware
from .worker.outcome import Outcome

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import ProxyTracerProvider, SpanKind, StatusCode
except ImportError:  # the otel extra is not installed
    ENABLED = False
else:
    ENABLED = True

logger = logging.getLogger("django_delayq.worker")

#: ``messaging.system`` of every span.
SYSTEM = "django_delayq"
#: The instrumentation scope's name.
SCOPE = "django_delayq"


@dataclass(slots=True)
class Sending:
    """An enqueue being traced: ``traceparent`` goes with the job; ``job_id`` is set on
    the span once known."""

    traceparent: str = ""
    span: Any = field(default=None, repr=False)

    def sent(self, job_id: str) -> None:
        """Name the job the enqueue stored (``messaging.message.id``)."""
        if self.span is not None:
            self.span.set_attribute("messaging.message.id", job_id)


#: Seconds between two looks for a tracer provider while none is set: a provider set
#: after the process started (in an app's ``ready()``, say) is used within this time.
PROVIDER_RECHECK_S = 1.0
_provider: dict[str, Any] = {"set": False, "looked": -PROVIDER_RECHECK_S}


def recording() -> bool:
    """Whether spans are made: a tracer provider is set (call only when :data:`ENABLED`).
    OpenTelemetry sets the global provider once, so once seen it is known for good; while
    none is, it is looked for at most once per :data:`PROVIDER_RECHECK_S` (each look
    reads the environment, a few microseconds that every enqueue and every job paid)."""
    if not _provider["set"]:
        now = time.monotonic()
        if now - _provider["looked"] >= PROVIDER_RECHECK_S:
            _provider["looked"] = now
            _provider["set"] = not isinstance(trace.get_tracer_provider(),
                                              ProxyTracerProvider)
    return _provider["set"]


def passed_on() -> str:
    """The ``traceparent`` of the current context, if it has one, to pass on (call only
    when :data:`ENABLED`)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return ""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier.get("traceparent", "")


@contextmanager
def sending(queue: str, task: str) -> Iterator[Sending]:
    """The span of one enqueue of ``task`` into ``queue``; call only when
    :func:`recording` (else the job takes :func:`passed_on`)."""
    tracer = trace.get_tracer(SCOPE)
    attributes = {"messaging.system": SYSTEM, "messaging.operation.type": "send",
                  "messaging.operation.name": "send", "messaging.destination.name": queue,
                  "delayq.task": task}
    with tracer.start_as_current_span(f"send {queue}", kind=SpanKind.PRODUCER,
                                      attributes=attributes) as span:
        carrier: dict[str, str] = {}
        if span.get_span_context().is_valid:
            propagate.inject(carrier)
        yield Sending(carrier.get("traceparent", ""), span)


class TraceAttempts(Middleware):
    """A CONSUMER span around each attempt, child of the enqueue's span."""

    def __init__(self) -> None:
        #: The span and context token of each running job, by ``id(job)``.
        self._open: dict[int, tuple[Any, Any]] = {}

    def _start(self, job: ClaimedJob) -> None:
        parent = (propagate.extract({"traceparent": job.traceparent}) if job.traceparent
                  else None)
        if not recording():
            if parent is not None:  # no span here, but the trace goes on through the task
                self._open[id(job)] = (None, otel_context.attach(parent))
            return
        span = trace.get_tracer(SCOPE).start_span(
            f"process {job.queue}", context=parent, kind=SpanKind.CONSUMER, attributes={
                "messaging.system": SYSTEM, "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.queue, "messaging.message.id": job.id,
                "delayq.task": job.task, "delayq.attempt": job.attempt,
                "delayq.max_attempts": job.max_attempts})
        token = otel_context.attach(trace.set_span_in_context(span))
        self._open[id(job)] = (span, token)

    def _end(self, job: ClaimedJob, outcome: Outcome) -> None:
        opened = self._open.pop(id(job), None)
        if opened is None:  # a hook before this one failed: no span was started
            return
        span, token = opened
        try:
            if span is None:
                return
            if not outcome.ok:
                if outcome.exception is not None:
                    span.record_exception(outcome.exception)
                span.set_status(StatusCode.ERROR, outcome.error)
            span.set_attribute("delayq.outcome", "completed" if outcome.ok else
                               "failed" if outcome.final else "retried")
            span.end()
        finally:
            otel_context.detach(token)

    def before_job(self, job: ClaimedJob, *, idle: bool) -> None:
        self._start(job)

    def after_job(self, job: ClaimedJob, outcome: Outcome) -> None:
        self._end(job, outcome)

    async def before_async_job(self, job: ClaimedJob, *, idle: bool) -> None:
        self._start(job)

    async def after_async_job(self, job: ClaimedJob, outcome: Outcome) -> None:
        self._end(job, outcome)


def middleware() -> list[Middleware]:
    """The tracing middleware of a worker: none without the ``otel`` extra."""
    return [TraceAttempts()] if ENABLED else []
