"""Is a worker alive? What ``manage.py delayq_health`` checks, from the workers registry.

A worker is healthy while its heartbeat is recent, it has at least one live thread
to run jobs (a supervisor: at least one live worker process) and its event loop of async
jobs, if it has one, is not stalled. Recent means three of its
heartbeat intervals and a second, never more than the workers alive allow
(:data:`~django_delayq.engine.workers.ALIVE_MS`). A worker that stops removes its record;
one killed leaves it, renewed by nobody, until its TTL: a check on the worker's own host
sees at once that its process is gone (its pid), a check elsewhere once its heartbeat
is stale; then it is missing.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import Broker
from ..engine.workers import ALIVE_MS, WorkerInfo, live_workers, process_ended
from .host import HEARTBEAT as HOST_HEARTBEAT


@dataclass(frozen=True, slots=True)
class WorkerHealth:
    name: str
    role: str
    pid: int | None
    age: float  # seconds since its last heartbeat
    threads: int | None
    problem: str  # "" when healthy

    @property
    def healthy(self) -> bool:
        return not self.problem


def heartbeat_interval(worker: WorkerInfo, default_lease: float) -> float:
    """Seconds between two heartbeats of ``worker`` (the worker's and the host's rules;
    ``default_lease`` for a record that does not say its lease)."""
    if worker.role == "supervisor":
        return HOST_HEARTBEAT
    lease = worker.lease or default_lease
    return max(0.2, min(lease / 3, 10.0))


def check_workers(broker: Broker, *, default_lease: float, worker: str | None = None,
                  queue: str | None = None,
                  stale_after: float | None = None) -> list[WorkerHealth]:
    """The health of each worker matching ``worker`` (its name, or its host's) and
    ``queue`` (workers serving it); every worker when both are None."""
    return [
        _health(info, stale_after, default_lease)
        for info in live_workers(broker, include_dead=True)
        if (worker is None or worker in (info.name, info.supervisor))
        and (queue is None or queue in info.queues)
    ]


def _health(info: WorkerInfo, stale_after: float | None, default_lease: float) -> WorkerHealth:
    limit = stale_after if stale_after is not None else min(
        3 * heartbeat_interval(info, default_lease) + 1, ALIVE_MS / 1000)
    problem = ""
    if process_ended(info.host, info.pid):
        problem = f"its process (pid {info.pid}) on this host is gone"
    elif info.seconds_ago > limit:
        problem = f"no heartbeat for {info.seconds_ago:.1f}s (limit {limit:.1f}s)"
    elif info.threads == 0:
        problem = "no live worker process" if info.role == "supervisor" else "no live thread"
    elif info.loop_stalled:
        problem = (f"its event loop of async jobs has run nothing for "
                   f"{info.loop_stalled:.1f}s (a coroutine blocks it)")
    return WorkerHealth(name=info.name, role=info.role, pid=info.pid, age=info.seconds_ago,
                        threads=info.threads, problem=problem)
