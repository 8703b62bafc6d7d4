"""Chains and groups: jobs that run after others, built on ``depends_on``.

``chain(a.bind(1), b.bind(), c.bind())`` runs each step once the one before it
succeeded (``pass_results=True`` passes the previous result as the first argument);
``group([...]).then(cb.bind())`` runs the callback once every member finished, with
their results in order as its first argument. The waiting and the release are the
engine's (``engine/flows.py``): exactly once, in the script that finishes the last
parent, or through the outbox across slots. See docs/workflows.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..conf import conf
from ..connection import get_broker
from ..engine import EnqueueRequest, EnqueueResult, Job, Status
from ..engine.flows import POLICIES
from ..engine.jobhash import reply_time
from ..engine.requests import new_job_id
from ..task import JobSpec, Task


def _task_of(spec: Any, what: str) -> tuple[Task[Any, Any], JobSpec]:
    """The task and spec of a workflow step (a ``JobSpec`` from ``Task.bind``, or a task)."""
    if isinstance(spec, Task):
        spec = spec.bind()
    if not isinstance(spec, JobSpec) or spec.task is None:
        raise TypeError(f"{what} takes task.bind(...) jobs, not {type(spec).__name__}")
    return spec.task, spec


@dataclass(frozen=True)
class _Step:
    """One job of a workflow, its id chosen before anything is sent."""

    task: Task[Any, Any]
    spec: JobSpec
    job_id: str
    queue: str
    parents: tuple[tuple[str, str], ...] = ()
    pass_results: str = ""
    on_parent_failure: str = "cancel"

    @classmethod
    def of(cls, spec: Any, what: str, queues: dict[int, str], **options: Any) -> _Step:
        """The step of a ``JobSpec`` (``queues`` remembers each task's queue: a group's
        members mostly share one task, and reading the setting costs)."""
        task, spec = _task_of(spec, what)
        queue = queues.get(id(task))
        if queue is None:
            queue = queues[id(task)] = task.queue_name
        return cls(task, spec, spec.job_id or new_job_id(), queue, **options)

    def request(self) -> EnqueueRequest:
        task, spec = self.task, self.spec
        args = tuple(spec.args)
        try:
            task.check_arguments((None, *args) if self.pass_results else args, spec.kwargs)
        except TypeError as exc:
            raise TypeError(f"{exc} (the parents' results come first)" if self.pass_results
                            else str(exc)) from None
        run_at, delay = task.run_at, task.delay
        if spec.run_at is not None or spec.delay is not None:
            run_at, delay = spec.run_at, spec.delay
        return EnqueueRequest(
            task=task.name, args=args, kwargs=dict(spec.kwargs), run_at=run_at, delay=delay,
            priority=task.priority if spec.priority is None else spec.priority,
            job_id=self.job_id, max_attempts=spec.max_attempts or task.attempts_allowed,
            timeout=task.timeout, depends_on=list(self.parents) or None,
            on_parent_failure=self.on_parent_failure, pass_results=self.pass_results)


def _send(steps: Sequence[_Step]) -> list[Job]:
    """Enqueue ``steps`` (parents before dependants): every step is checked first, then
    runs of consecutive steps of one queue go as one ``enqueue_many`` each."""
    requests = [step.request() for step in steps]  # every check before any write
    if conf.EAGER:
        return _run_eagerly(steps)
    broker = get_broker()
    results: list[EnqueueResult] = []
    start = 0
    while start < len(steps):
        end = start
        while end < len(steps) and steps[end].queue == steps[start].queue:
            end += 1
        broker.enqueue_many(steps[start].queue, requests[start:end], results=results)
        start = end
    jobs = []
    for step, res in zip(steps, results, strict=True):
        jobs.append(Job(id=res.job_id, queue=step.queue, task_name=step.task.name,
                        status=res.status, enqueued_at=reply_time(res.enqueued_at_ms),
                        created=res.added, broker=broker, parent_refs=list(step.parents)))
    return jobs


def _run_eagerly(steps: Sequence[_Step]) -> list[Job]:
    """Eager mode: run the steps now, in order, each with its parents' results; a step
    whose parent did not complete follows its policy without a queue."""
    done: dict[str, Job] = {}
    jobs = []
    for step in steps:
        parents = [done[job_id] for _, job_id in step.parents]
        broken = [p for p in parents if p.status != Status.COMPLETED]
        if broken and step.on_parent_failure != "run":
            job = Job(id=step.job_id, queue=step.queue, task_name=step.task.name,
                      status=Status.FAILED if step.on_parent_failure == "fail"
                      else Status.CANCELLED,
                      error=f"DependencyFailed: parent {broken[0].id} {broken[0].status}")
        else:
            task = step.task.using(job_id=step.job_id, depends_on=parents or None,
                                   pass_results=step.pass_results or None)
            job = task.enqueue(*step.spec.args, **step.spec.kwargs)
        done[step.job_id] = job
        jobs.append(job)
    return jobs


@dataclass(frozen=True)
class Chain:
    """Steps that run one after another, each once the one before it succeeded."""

    steps: tuple[JobSpec, ...]
    pass_results: bool = False
    on_parent_failure: str = "cancel"

    def enqueue(self) -> list[Job]:
        """Enqueue every step (the first ready, the others ``waiting``); the jobs in order."""
        steps: list[_Step] = []
        queues: dict[int, str] = {}
        for spec in self.steps:
            parents = ((steps[-1].queue, steps[-1].job_id),) if steps else ()
            steps.append(_Step.of(spec, "chain", queues, parents=parents,
                                  pass_results="one" if parents and self.pass_results else "",
                                  on_parent_failure=self.on_parent_failure))
        return _send(steps)


def chain(*steps: JobSpec | Task[Any, Any], pass_results: bool = False,
          on_parent_failure: str = "cancel") -> Chain:
    """A chain of ``task.bind(...)`` jobs: each runs once the one before it succeeded.

    With ``pass_results`` each step after the first receives the previous step's result
    (JSON, as every result) as its first argument. ``on_parent_failure`` is what a step
    does when the one before it fails for good or is cancelled ("cancel", the default:
    so are all the steps after it; "run"; "fail").
    """
    if not steps:
        raise ValueError("chain needs at least one step")
    if on_parent_failure not in POLICIES:
        raise ValueError(f"on_parent_failure must be one of {', '.join(POLICIES)}")
    return Chain(tuple(_task_of(s, "chain")[1] for s in steps), pass_results,
                 on_parent_failure)


@dataclass(frozen=True)
class GroupJobs:
    """The jobs of an enqueued group: its members in order, and its callback if any."""

    members: list[Job]
    callback: Job | None = None


@dataclass(frozen=True)
class Group:
    """Jobs that run independently; :meth:`then` adds a callback that waits for them all."""

    members: tuple[JobSpec, ...]
    callback: JobSpec | None = None
    on_member_failure: str = "cancel"

    def then(self, callback: JobSpec | Task[Any, Any], *,
             on_member_failure: str = "cancel") -> Group:
        """Run ``callback`` once every member finished, with the list of their results
        (in the members' order) as its first argument. A member that fails for good or
        is cancelled makes the callback do ``on_member_failure``: "cancel" (default),
        "run" (its result is then ``None``) or "fail"."""
        if on_member_failure not in POLICIES:
            raise ValueError(f"on_member_failure must be one of {', '.join(POLICIES)}")
        return Group(self.members, _task_of(callback, "then")[1], on_member_failure)

    def enqueue(self) -> GroupJobs:
        """Enqueue the members, then the callback (a member's queue's ``enqueue_many``
        per run of members of one queue; the callback in the same call when it shares
        the queue)."""
        queues: dict[int, str] = {}
        steps = [_Step.of(spec, "group", queues) for spec in self.members]
        if self.callback is not None:
            steps.append(_Step.of(self.callback, "then", queues,
                                  parents=tuple((s.queue, s.job_id) for s in steps),
                                  pass_results="all",
                                  on_parent_failure=self.on_member_failure))
        jobs = _send(steps)
        if self.callback is None:
            return GroupJobs(jobs)
        return GroupJobs(jobs[:-1], jobs[-1])


def group(members: Iterable[JobSpec | Task[Any, Any]]) -> Group:
    """A group of ``task.bind(...)`` jobs that run independently (see :meth:`Group.then`)."""
    bound = tuple(_task_of(m, "group")[1] for m in members)
    if not bound:
        raise ValueError("group needs at least one member")
    return Group(bound)
