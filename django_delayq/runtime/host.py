"""The host: the process ``runworker`` (and ``delayq_mirror``) runs as, which runs no job.

It keeps its worker processes running (:mod:`.children`: none for ``delayq_mirror``,
one for a plain ``runworker``, N for ``--processes N``) and runs the background loops
(:class:`Service`: the model mirror, the outbox relay, the lake export, the periodic
scheduler) on threads of its own, from one list. A host's process holds no job, so no
job can freeze it: it is what restarts a worker process that died or exited to be
replaced, whatever the job did.

It records itself in the workers registry (``role=supervisor``; each worker process
names it in ``supervisor``) every :data:`HEARTBEAT` seconds.

Stops (:meth:`Host.request_stop`, which the command's signal handlers call): the first
stops the worker processes warmly, then, once they are gone, the services, each finishing
what it has in hand (the mirror writes the workers' last events, at most 5 s); ``run()``
returns :data:`EXIT_OK` if every worker process stopped cleanly. A second request stops
the worker processes at once (:mod:`.children`) and the services without draining, and
``run()`` returns :data:`EXIT_FORCED`. A service whose loop ends by itself while the
host runs is started again after a backoff.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..engine import Broker, JobAborted, JobTimeout
from ..engine.backoff import backoff_delay
from ..engine.job import aborts_asked
from ..engine.logfields import log
from ..engine.workers import forget, new_worker_name, record_alive
from .backoff import CALL_FAILED
from .children import QUICK_DEATH, Child, Children
from .worker.exit_codes import EXIT_FORCED, EXIT_OK, EXIT_RESTART
from .worker.outcome import describe

logger = logging.getLogger("django_delayq.worker")

#: Seconds between two records of the host in the workers registry.
HEARTBEAT = 5.0
#: Seconds each service may take to stop (a drain included) before the host goes on.
SERVICE_STOP = 15.0


class Service(Protocol):
    """A background loop a host runs on a thread of its own."""

    #: Its name, in log lines and the host's record.
    name: str

    def run(self) -> None:
        """Loop until :meth:`stop`; what it raises is logged and it starts again."""

    def stop(self, *, drain: bool) -> None:
        """Make :meth:`run` return soon; with ``drain``, after finishing what is left
        (bounded). Called from another thread, once."""


@dataclass
class _Running:
    service: Service
    thread: threading.Thread | None = None
    #: Its ends in a row, each sooner than QUICK_DEATH after its start: its next start
    #: waits longer with each (an end after a longer run starts the count over).
    failures: int = 0
    start_at: float = 0.0
    began: float = 0.0
    stopped: threading.Event = field(default_factory=threading.Event)


class Host:
    """Runs worker processes and services until stopped. Signals are the command's
    business: it calls :meth:`request_stop`."""

    def __init__(self, *, broker: Broker, children: Sequence[Child] = (),
                 services: Sequence[Service] = (), name: str | None = None,
                 burst: bool = False, info: dict[str, Any] | None = None,
                 queues: Sequence[str] = (), stop_within: float | None = None) -> None:
        self.name = name or new_worker_name()
        self.broker = broker
        self.burst = burst
        self.children = Children(list(children), name=self.name, burst=burst,
                                 stop_within=stop_within)
        #: The shards its worker processes serve: where they hold jobs.
        self._shards = [keys for queue in queues for keys in broker.shards(queue)]
        for child in children:
            child.on_exit.append(self._hand_back)
        self._services = [_Running(s) for s in services]
        self._info = info or {}
        self._next_beat = 0.0
        self._said_stopping = False
        self._stop_requests = 0

    def request_stop(self) -> None:
        """First call: warm stop; second: cold stop (safe from a signal handler)."""
        self._stop_requests += 1
        self.children.request_stop()

    @property
    def restarts(self) -> int:
        return self.children.restarts

    def run(self) -> int:
        log(logger, logging.INFO, "host started", host=self.name,
            processes=len(self.children.children),
            services=",".join(r.service.name for r in self._services) or "-", pid=os.getpid())
        try:
            self.children.run(self._tick)
            self._stop_services(drain=not self.children.forced)
        finally:
            forget(self.broker, self.name)
        log(logger, logging.INFO, "host stopped", host=self.name, restarts=self.restarts)
        return EXIT_FORCED if self.children.children and self.children.forced else EXIT_OK

    def _tick(self, now: float) -> float:
        """Each turn: services kept running, the burst's end, the heartbeat; returns the
        most seconds to sleep."""
        if self.children.stopping and not self._said_stopping:
            self._said_stopping = True
            log(logger, logging.INFO, "host stopping", host=self.name)
        if not self.children.stopping:
            self._keep_services(now)
            if self.burst and self.children.children and not self.children.pending():
                log(logger, logging.INFO, "burst done", host=self.name)
                self.request_stop()
                return 0.0
        if now >= self._next_beat:
            self._record_alive()
            self._note_aborts(now)
            self._next_beat = now + HEARTBEAT
        return max(0.0, self._next_beat - time.monotonic())

    def _keep_services(self, now: float) -> None:
        for running in self._services:
            thread = running.thread
            if thread is not None and thread.is_alive():
                continue
            if thread is not None:  # its loop ended while the host runs: again, later
                running.thread = None
                quick = now - running.began < QUICK_DEATH
                running.failures = running.failures + 1 if quick else 1
                running.start_at = now + backoff_delay(running.failures, first=1.0, cap=30.0)
                log(logger, logging.WARNING, f"service {running.service.name} ended",
                    retry_in_s=round(running.start_at - now, 1), host=self.name)
            if now >= running.start_at:
                running.thread = threading.Thread(
                    target=self._run_service, args=(running,),
                    name=f"delayq-{running.service.name}", daemon=True)
                running.thread.start()
                running.began = now

    @staticmethod
    def _run_service(running: _Running) -> None:
        try:
            running.service.run()
        except Exception:
            log(logger, logging.ERROR, f"service {running.service.name} failed",
                exc_info=True)


    def _stop_services(self, *, drain: bool) -> None:
        """Stop every service, each within :data:`SERVICE_STOP` seconds; a stop request
        that comes meanwhile cuts the drains short."""
        for running in self._services:
            thread = running.thread
            if thread is None or not thread.is_alive():
                continue
            running.service.stop(drain=drain)
            deadline = time.monotonic() + SERVICE_STOP
            while thread.is_alive() and time.monotonic() < deadline:
                if drain and self._stop_requests > 1:
                    drain = False
                    for each in self._services:
                        each.service.stop(drain=False)
                thread.join(0.1)
            if thread.is_alive():
                log(logger, logging.WARNING, f"service {running.service.name} did not stop "
                    "in time", within_s=SERVICE_STOP, host=self.name)

    def _note_aborts(self, now: float) -> None:
        """With each heartbeat: note which jobs the worker processes run were asked to
        stop (``Job.abort()``), so that one whose process never hears of it (it holds
        the GIL) is killed at the abort's grace all the same (:mod:`.children`)."""
        running = {(p.queue, p.job_id): child for child in self.children.running()
                   if child.board is not None for p in child.board.posted()}
        try:
            asked = aborts_asked(self.broker, list(running))
        except CALL_FAILED as exc:
            log(logger, logging.WARNING, "could not read the aborts asked for",
                host=self.name, error=exc)
            return
        for child in self.children.running():  # jobs no longer running are forgotten
            child.aborts = {job: at for job, at in child.aborts.items() if job in asked}
        for job in asked:
            running[job].aborts.setdefault(job, now)

    def _hand_back(self, child: Child, pid: int, code: int) -> None:
        """Settle what the ended worker process of ``child`` held, before the next one
        starts: fail the jobs it was killed for (their time limit, or their abort: those
        end cancelled), and hand the others back now rather than when their leases
        lapse; those it had not started go back unattempted. A process that stopped
        cleanly holds nothing: nothing is found."""
        if child.worker is None or not self._shards:
            return
        overrun = {(p.queue, p.job_id) for p in child.overrun}
        posted_jobs = [] if child.board is None else child.board.posted()
        try:
            asked = aborts_asked(self.broker, [(p.queue, p.job_id) for p in posted_jobs])
        except CALL_FAILED:
            asked = {}
        batch = self.broker.batch()
        for posted in posted_jobs:
            keys = self.broker.keys_for(posted.queue, posted.job_id)
            who = asked.get((posted.queue, posted.job_id))
            if who is not None:  # fail.lua ends it cancelled
                error = describe(JobAborted(
                    f"aborted by {who}; it did not stop within the grace (C code holding "
                    f"the GIL, or a frozen process): its worker process was killed and "
                    f"replaced"))
                self.broker.add_fail(batch, keys, posted.job_id, posted.attempt, error, "",
                                     -1, posted.started_ms)
            elif (posted.queue, posted.job_id) in overrun:
                error = describe(JobTimeout(
                    f"the job ran past its time limit of {posted.timeout:g}s and its "
                    f"worker process did not end it (C code holding the GIL, or a frozen "
                    f"process): the process was killed and replaced"))
                self.broker.add_fail(batch, keys, posted.job_id, posted.attempt, error, "",
                                     posted.retry_delay_ms, posted.started_ms)
            else:  # it ran: its attempt counts, though its start note never landed
                self.broker.add_start(batch, keys, child.worker,
                                      [(posted.job_id, posted.attempt, posted.started_ms)])
        try:
            batch.run()
            returned, dead = self.broker.reclaim_worker(child.worker, self._shards)
            if code not in (0, EXIT_RESTART):
                forget(self.broker, child.worker)  # it could not remove its record itself
        except CALL_FAILED as exc:
            log(logger, logging.WARNING, "could not hand back the jobs of an ended worker "
                "(their leases will lapse)", worker=child.worker, host=self.name, error=exc)
            return
        if child.overrun or returned or dead:
            log(logger, logging.WARNING, "jobs of an ended worker", worker=child.worker,
                pid=pid, failed_at_time_limit=len(child.overrun), handed_back=returned,
                dead_lettered=dead, host=self.name)

    def _record_alive(self) -> None:
        live = self.children.running()
        try:
            record_alive(self.broker, self.name, 60, {
                "role": "supervisor", **self._info,
                "processes": len(self.children.children),
                # live worker processes, for delayq_health; a host of services alone
                # (delayq_mirror) runs none by design, and says nothing of them
                **({"threads": len(live)} if self.children.children else {}),
                "children": ",".join(str(c.pid) for c in live),
                "services": ",".join(r.service.name for r in self._services),
                "restarts": self.restarts,
            })
        except CALL_FAILED as exc:
            log(logger, logging.WARNING, "host heartbeat failed", host=self.name, error=exc)
