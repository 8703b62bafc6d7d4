"""``@task``: declaring tasks and enqueuing them.

``@task`` registers each task in the runtime's :data:`registry`, which workers resolve
task names in (it is filled by importing each installed app's ``tasks`` module); a
worker never imports a path read from Redis.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import inspect
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, Unpack, overload

from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from .conf import conf
from .connection import get_broker
from .eager import run_eagerly
from .engine import (
    Broker,
    BulkResult,
    EnqueueRequest,
    EnqueueResult,
    Job,
    UnknownTask,
    validation,
)
from .engine.fastpaths import arg_shape, positional_names, signature
from .engine.flows import dependencies, parent_ref
from .engine.jobhash import reply_time
from .flow_control import FlowControl
from .jobspec import JobSpec as JobSpec  # public here too, where Task.bind makes it
from .jobspec import requests_of
from .options import FLOW_OPTIONS, EnqueueOptions, TaskOptions, given_options
from .runtime import tracing
from .runtime.registry import DuplicateTaskName
from .runtime.registry import registry as registry  # where @task registers, public here
from .runtime.schedule import Schedule

if TYPE_CHECKING:
    from .outbox import OutboxJob

P = ParamSpec("P")
T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Task(Generic[P, T]):
    """A function that can run later on a worker. Build one with :func:`task`.

    ``using()`` returns a copy with other options; ``enqueue()`` sends a job; calling
    the task runs the function now, in this process.
    """

    func: Callable[P, T]
    name: str
    queue: str | None = None
    priority: int = 0
    delay: float | dt.timedelta | None = None
    run_at: dt.datetime | None = None
    job_id: str | None = None
    max_attempts: int | None = None
    retry_backoff: float | None = None
    retry_backoff_max: float | None = None
    #: Time limit of each attempt, seconds or a timedelta (None: ``DELAYQ["TIMEOUT"]``
    #: or ``runworker --timeout``); at the limit ``JobTimeout`` is raised in the job.
    timeout: float | dt.timedelta | None = None
    #: The database alias whose transaction :meth:`enqueue_in_transaction` joins.
    database: str | None = None
    #: Jobs to wait for (jobs, job ids of this task's queue, or ``(queue, id)`` pairs):
    #: the job is ``waiting`` until they all finish (see docs/workflows.md).
    depends_on: tuple[Any, ...] | None = None
    #: When a parent fails for good or is cancelled: "cancel" (default), "run", "fail".
    on_parent_failure: str = "cancel"
    #: What the job receives of its parents' results as its first argument: ""
    #: (nothing), "one" (the first parent's result) or "all" (the list, in order).
    pass_results: str = ""
    #: Periodic tasks: a cron expression (in ``tz``) or a period; see periodic.py.
    cron: str | None = None
    tz: str | None = None
    every: float | dt.timedelta | None = None
    #: Concurrency and dedupe keys (docs/flow-control.md).
    flow: FlowControl | None = None
    schedule: Schedule | None = dataclasses.field(default=None, init=False, repr=False,
                                                  compare=False)

    def __post_init__(self) -> None:
        validation.check_task_name(self.name)
        try:
            schedule = Schedule.build(self.cron, self.every, self.tz)
        except ValueError as exc:
            raise ValueError(f"{self.name}: {exc}") from None
        except ImportError as exc:  # an extra the schedule needs is not installed
            raise ImproperlyConfigured(str(exc)) from exc
        object.__setattr__(self, "schedule", schedule)
        if self.queue is not None:
            validation.validate_queue_name(self.queue)
        validation.check_priority(self.priority)
        if self.delay is not None:
            validation.delay_ms(self.delay)
        if self.run_at is not None:
            validation.run_at_ms(self.run_at)
        if self.delay is not None and self.run_at is not None:
            raise ValueError(f"{self.name}: give run_at or delay, not both")
        if self.job_id is not None:
            validation.validate_new_job_id(self.job_id)
        if self.max_attempts is not None:
            validation.check_max_attempts(self.max_attempts)
        if self.timeout is not None:
            try:
                validation.timeout_ms(self.timeout)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{self.name}: {exc}") from None
        if self.depends_on is not None or self.on_parent_failure != "cancel" or \
                self.pass_results:
            try:
                dependencies(self.depends_on, self.queue_name, self.on_parent_failure,
                             self.pass_results)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"{self.name}: {exc}") from None

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.queue_name!r}>"

    @property
    def queue_name(self) -> str:
        return self.queue or conf.DEFAULT_QUEUE

    @property
    def attempts_allowed(self) -> int:
        return self.max_attempts or conf.MAX_ATTEMPTS

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> T:
        """Call the function now, in this process (an ``async def`` one returns its
        coroutine, as calling it would)."""
        return self.func(*args, **kwargs)

    def call(self, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the function now, in this process (no queue involved); an ``async def``
        one runs to completion through ``async_to_sync``, as Django's ``Task.call``."""
        if inspect.iscoroutinefunction(self.func):
            return async_to_sync(self.func)(*args, **kwargs)
        return self.func(*args, **kwargs)

    async def acall(self, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run the function now from async code: awaited if ``async def``, else in a
        thread through ``sync_to_async``, as Django's ``Task.acall``."""
        if inspect.iscoroutinefunction(self.func):
            return await self.func(*args, **kwargs)
        return await sync_to_async(self.func)(*args, **kwargs)

    def using(self, **options: Unpack[EnqueueOptions]) -> Task[P, T]:
        """A copy of this task with other enqueue options (:class:`EnqueueOptions`; an
        option given as None keeps this task's; ``run_at`` replaces ``delay``;
        ``database`` is the alias :meth:`enqueue_in_transaction` writes to).

        ``depends_on`` makes the job wait for those jobs (``waiting``): it becomes due at
        the later of its own run_at and the end of its last parent. ``on_parent_failure``
        says what it does when a parent fails for good or is cancelled: "cancel"
        (default), "run" anyway, or "fail". ``pass_results`` ("one", "all") passes the
        parents' results as the first argument. See docs/workflows.md.

        ``concurrency_key`` (a string, or a callable of the task's arguments) with
        ``concurrency_limit``: at most that many of the key's jobs run at once;
        ``key_rate_limit`` ("10/m"): at most so many of them start per period;
        ``key_weight`` (1 to 16): the key's jobs take that many turns for each turn of
        a key of weight 1.
        ``dedupe_key`` with ``dedupe`` ("exists", "throttle", "debounce", "keep_last")
        and ``dedupe_window``: see docs/flow-control.md.
        """
        changes: dict[str, Any] = given_options(options, EnqueueOptions, "using()")
        if "run_at" in changes:
            changes["delay"] = None
        elif "delay" in changes:
            changes["run_at"] = None
        if "depends_on" in changes:
            changes["depends_on"] = tuple(changes["depends_on"])
        keyed = {key: changes.pop(key) for key in FLOW_OPTIONS if key in changes}
        if keyed:
            flow = (self.flow or FlowControl()).merged(**keyed)
            if flow != self.flow:
                changes["flow"] = flow
        return dataclasses.replace(self, **changes)

    def check_arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise ``TypeError`` if the function cannot be called with these arguments."""
        shape = arg_shape(self.func)
        if shape is not None and shape.accepts(args, kwargs):
            return
        try:
            signature(self.func).bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}: {exc}") from None

    def enqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Send a job to the queue (one Redis round trip) and return it.

        Raises ``TypeError`` for arguments the function does not take or that are not
        JSON, and :class:`~django_delayq.DelayQConnectionError` if Redis is unreachable.
        A job whose ``job_id`` already exists is not enqueued again: the returned job
        has ``created=False`` and the existing job's status.
        """
        self.check_arguments(self._with_results(args) if self.pass_results else args, kwargs)
        if conf.EAGER:
            if self.pass_results:  # the parents ran already: their results, if known
                results = [getattr(p, "result", None) for p in self.depends_on or ()]
                head = (results[0] if results else None) if self.pass_results == "one" \
                    else results
                args = (head, *args)  # type: ignore[assignment]
            return run_eagerly(self, args, kwargs, positional_names(self.func))
        return self.enqueue_to_redis(args, kwargs)

    def enqueue_to_redis(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Job:
        """:meth:`enqueue` with its arguments checked, whatever ``EAGER`` says: the Tasks
        backend's path, which eager mode leaves alone (Django's own immediate backend is
        the Tasks framework's way to run a task at once)."""
        broker = get_broker()
        queue, max_attempts = self.queue_name, self.attempts_allowed
        resolved = self.flow.resolve(args, kwargs) if self.flow else (None, None, None)
        keys = resolved[0]
        if tracing.ENABLED and tracing.recording():
            with tracing.sending(queue, self.name) as span:
                res = self._send(broker, args, kwargs, span.traceparent, resolved)
                span.sent(res.job_id)
        else:  # without a provider a context upstream still names the trace
            res = self._send(broker, args, kwargs,
                             tracing.passed_on() if tracing.ENABLED else "", resolved)
        # Every input was checked before the write, so these times are in range; were
        # one not (a damaged existing job), the job is still returned, not an error.
        enqueued_at = reply_time(res.enqueued_at_ms)
        run_at = enqueued_at if res.run_at_ms == res.enqueued_at_ms else reply_time(
            res.run_at_ms)
        return Job(
            id=res.job_id, queue=queue, task_name=self.name, status=res.status,
            args=list(args), kwargs=dict(kwargs), priority=self.priority, run_at=run_at,
            max_attempts=max_attempts, enqueued_at=enqueued_at, created=res.added,
            broker=broker, outcome=res.outcome,
            concurrency_key=keys.concurrency_key or None if keys else None,
            parent_refs=[parent_ref(p, queue) for p in self.depends_on]
            if self.depends_on else [],
        )

    def _send(self, broker: Broker, args: Sequence[Any], kwargs: dict[str, Any],
              traceparent: str, resolved: tuple[Any, str | None, Any]) -> EnqueueResult:
        """The enqueue call of :meth:`enqueue`, with its flow-control keys, job id and
        delay as :meth:`FlowControl.resolve` gave them."""
        keys, job_id, delay = resolved
        return broker.enqueue(
            self.queue_name, self.name, args, kwargs,
            run_at=None if delay else self.run_at, delay=delay or self.delay, keyed=keys,
            priority=self.priority, job_id=job_id or self.job_id,
            max_attempts=self.attempts_allowed,
            arg_names=positional_names(self.func)[1 if self.pass_results else 0:],
            timeout=self.timeout, depends_on=self.depends_on,
            on_parent_failure=self.on_parent_failure, pass_results=self.pass_results,
            traceparent=traceparent,
        )

    def _with_results(self, args: Sequence[Any]) -> Sequence[Any]:
        """``args`` as the function receives them: behind the parents' results when
        ``pass_results`` passes them (a placeholder here, for the argument check)."""
        return (None, *args) if self.pass_results else args

    async def aenqueue(self, *args: P.args, **kwargs: P.kwargs) -> Job:
        """:meth:`enqueue` from async code (the Redis call runs in a thread)."""
        return await sync_to_async(self.enqueue, thread_sensitive=False)(*args, **kwargs)

    def enqueue_on_commit(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Enqueue once the current database transaction commits (at once outside one).

        Arguments are checked now, so a mistake raises here rather than after commit. If
        Redis is unreachable at the commit, or the process dies first, the job is lost:
        :meth:`enqueue_in_transaction` makes it part of the transaction instead.
        """
        self.check_arguments(args, kwargs)
        transaction.on_commit(partial(self.enqueue, *args, **kwargs))

    def enqueue_in_transaction(self, *args: P.args, **kwargs: P.kwargs) -> OutboxJob:
        """Write the job into the outbox in the current database transaction.

        The job exists if and only if the transaction commits: the row is part of it.
        After the commit, a hook sends the job to Redis at once; if Redis is unreachable
        (or the process dies first) the row waits for the relay (a thread of
        ``runworker``, or ``manage.py delayq_relay``). The arguments and options pass the
        checks of :meth:`enqueue` now; the job id is assigned now and the returned job's
        status is ``"outbox"``. A ``delay`` is turned into a due time on this process's
        clock now, so a job relayed late keeps its time (and starts at once if due).
        Outside a transaction (autocommit) the row is committed at once and sent at once.
        The database is ``using(database=...)``'s alias, else ``default``. Concurrency and
        dedupe keys are resolved now and act when the row reaches Redis, as they would
        for an :meth:`enqueue` then (a debounce window runs from there); the returned
        job's ``outcome`` is ``"outbox"`` until then.
        """
        # Imported at the call: the outbox needs its model, and a module declaring tasks
        # may be imported while Django still loads its apps (no model may load then).
        from .outbox import write

        if self.depends_on:
            raise ValueError(f"{self.name}: depends_on is not supported by "
                             "enqueue_in_transaction; use enqueue_on_commit")
        self.check_arguments(args, kwargs)
        keys, job_id, debounce = self.flow.resolve(args, kwargs) if self.flow else (
            None, None, None)
        run_at = self.run_at
        if debounce is not None:
            run_at = None  # the window runs from when the row reaches Redis (outbox.send)
        elif self.delay is not None:
            # Fixed now, on this process's clock: the relay must not add its own lateness.
            run_at = dt.datetime.now(dt.UTC) + dt.timedelta(
                milliseconds=validation.delay_ms(self.delay))
        request = EnqueueRequest(task=self.name, args=args, kwargs=dict(kwargs), run_at=run_at,
                                 priority=self.priority, job_id=job_id or self.job_id,
                                 max_attempts=self.attempts_allowed, timeout=self.timeout,
                                 keyed=keys)
        return write(self.queue_name, request, positional_names(self.func), self.database)

    def bind(self, *args: Any, **kwargs: Any) -> JobSpec:
        """A :class:`JobSpec` of this task with these arguments and this copy's options
        (``task.using(job_id=..., delay=...).bind(...)``), for :meth:`enqueue_many` and
        the workflows (:func:`~django_delayq.chain`, :func:`~django_delayq.group`).

        Arguments are checked now as far as they go (an unknown keyword or too many
        arguments raise ``TypeError``); a missing one is allowed, as a workflow may pass
        a parent's result first, and is refused when the job is enqueued.
        """
        shape = arg_shape(self.func)
        if shape is None or not shape.accepts(args, kwargs):
            try:
                signature(self.func).bind_partial(*args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{self.name}: {exc}") from None
        return JobSpec(args, kwargs, job_id=self.job_id, run_at=self.run_at, delay=self.delay,
                       priority=self.priority, max_attempts=self.max_attempts, task=self)

    def enqueue_many(
        self, jobs: Iterable[JobSpec | Sequence[Any] | Mapping[str, Any]
                             | tuple[Sequence[Any], Mapping[str, Any]]],
        *, chunk_size: int = 1_000, results: list[EnqueueResult] | None = None,
    ) -> BulkResult:
        """Enqueue many jobs of this task, one round trip per chunk of ``chunk_size``.

        Each item is a :class:`JobSpec` (arguments plus its own job_id, run_at, delay,
        priority, max_attempts), a sequence of positional arguments, a mapping of
        keyword arguments, or an ``(args, kwargs)`` pair. Options a ``JobSpec`` leaves out
        come from this task (``using()`` included). Every item of a chunk is checked
        before the chunk is sent, so a bad item raises without sending its chunk (the
        chunks before it are enqueued: the error says how many). An id that exists is
        skipped and reported in ``BulkResult.duplicate_ids``; jobs a dedupe mode replaced
        or ignored are counted in ``replaced`` and ``ignored``.
        """
        sent = BulkResult()
        return get_broker().enqueue_many(self.queue_name, self._requests(jobs),
                                         chunk_size=chunk_size, results=results, total=sent)

    def _requests(self, jobs: Iterable[Any]) -> Iterator[EnqueueRequest]:
        """The request of each item of :meth:`enqueue_many`, its arguments checked."""
        return requests_of(self, jobs)

    def retry_delay(self, attempt: int) -> float:
        """Seconds to wait before retrying after failed attempt ``attempt`` (1-based)."""
        base = conf.RETRY_BACKOFF if self.retry_backoff is None else self.retry_backoff
        cap = conf.RETRY_BACKOFF_MAX if self.retry_backoff_max is None else self.retry_backoff_max
        delay = min(cap, base * float(2 ** min(attempt - 1, 62)))
        return delay * random.uniform(0.5, 1.0)


def registered(name: str) -> Task[Any, Any]:
    """The task ``@task`` registered as ``name``; :class:`UnknownTask` if there is none."""
    found = registry.find(name)
    if not isinstance(found, Task):
        registry.get(name)  # raises UnknownTask, worded for every caller alike
        raise UnknownTask(f"{name!r} is not a task declared with @task")
    return found


@overload
def task(function: Callable[P, T], /) -> Task[P, T]: ...


@overload
def task(function: None = None, /, **options: Unpack[TaskOptions]
         ) -> Callable[[Callable[P, T]], Task[P, T]]: ...


def task(function: Callable[P, T] | None = None, /, **options: Unpack[TaskOptions]
         ) -> Task[P, T] | Callable[[Callable[P, T]], Task[P, T]]:
    """Declare a task; use bare (``@task``) or with options (``@task(queue="emails")``).

    The task's name is ``module.qualname`` unless ``name`` is given. ``queue`` defaults to
    ``DELAYQ["DEFAULT_QUEUE"]``, ``max_attempts`` to ``DELAYQ["MAX_ATTEMPTS"]``.
    ``cron="*/5 * * * *"`` (with ``tz=``, needs the ``cron`` extra) or ``every=`` (a
    timedelta or seconds) makes it periodic: workers serving its queue enqueue each
    occurrence once, with no arguments. ``concurrency_key`` (a string, or a callable of
    the arguments) with ``concurrency_limit``: at most that many of a key's jobs run at
    once, ``key_rate_limit`` ("10/m") at most so many start per period, ``key_weight``
    the key's share of the turns (docs/flow-control.md).
    """

    fields = given_options(options, TaskOptions, "@task")
    name = fields.pop("name", None)
    flow = FlowControl().merged(concurrency_key=fields.pop("concurrency_key", None),
                                concurrency_limit=fields.pop("concurrency_limit", None),
                                key_rate_limit=fields.pop("key_rate_limit", None),
                                key_weight=fields.pop("key_weight", None))

    def decorate(func: Callable[P, T]) -> Task[P, T]:
        if not callable(func):
            raise TypeError(f"@task decorates a function, not {type(func).__name__}")
        task_name = name or f"{func.__module__}.{func.__qualname__}"
        if name is None and "<locals>" in func.__qualname__:
            raise ValueError(
                f"{func.__qualname__} is not a module-level function: define tasks at "
                "module level, or give @task(name=...)"
            )
        t: Task[P, T] = Task(func=func, name=task_name, flow=flow, **fields)
        try:
            registry.register(t)
        except DuplicateTaskName as exc:
            raise ImproperlyConfigured(str(exc)) from None
        return t

    if function is not None:
        return decorate(function)
    return decorate
