"""The process pool of ``runworker --processes N``: a supervisor and its children.

The supervisor runs no job. It keeps N worker processes (each a normal ``runworker``
with its threads) and, unless the mirror is off, one ``delayq_mirror`` process running
(:class:`.children.Children`: fresh interpreters, restarts with backoff, stops in
order), forwards stop signals, and records itself in the workers registry
(``role=supervisor``; each child names it in ``supervisor``).

Stops: the first stop request stops every worker child warmly (each finishes its running
jobs within the grace period and hands back the rest), then the mirror once the workers
are gone; ``run()`` returns :data:`EXIT_OK` if every worker stopped cleanly. A second
request makes each child exit at once (as a second signal to ``runworker`` does), kills
what is left after :data:`.children.KILL_AFTER` seconds, and ``run()`` returns
:data:`EXIT_FORCED`.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence

from ..connection import get_broker
from ..engine import Broker
from ..engine.workers import forget, record_alive
from .backoff import REDIS_ERRORS
from .children import MIRROR, WORKER, Child, Children

logger = logging.getLogger("django_delayq.worker")

EXIT_OK = 0
EXIT_FORCED = 1
#: Seconds between two records of the supervisor in the workers registry.
HEARTBEAT = 5.0


class Supervisor:
    """Runs the children of a pool. Signals are the management command's business: it
    calls :meth:`request_stop` and :meth:`wake`."""

    def __init__(
        self,
        worker_args: Sequence[str],
        processes: int,
        *,
        mirror_args: Sequence[str] | None = None,
        queues: Sequence[str] = (),
        concurrency: int | None = None,
        burst: bool = False,
        name: str | None = None,
        broker: Broker | None = None,
    ) -> None:
        if processes < 1:
            raise ValueError("processes must be at least 1")
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.processes = processes
        self.queues = list(queues)
        self.concurrency = concurrency
        self.burst = burst
        self.broker = broker or get_broker()
        common = ["--supervisor", self.name, "--supervisor-pid", str(os.getpid())]
        children = [Child(WORKER, i, ["runworker", *worker_args, *common])
                    for i in range(processes)]
        if mirror_args is not None:
            children.append(Child(MIRROR, 0, ["delayq_mirror", *mirror_args, "--stop-on-eof",
                                              "--supervisor-pid", str(os.getpid())]))
        self.children = Children(children, name=self.name)
        self._next_beat = 0.0
        self._said_stopping = False

    # -- control (safe from a signal handler: no lock, one write) --------------------

    def request_stop(self) -> None:
        """First call: warm stop; second: cold stop."""
        self.children.request_stop()

    def wake(self) -> None:
        """Make the main loop look at its children now (after SIGCHLD, say)."""
        self.children.wake()

    @property
    def stopping(self) -> bool:
        return self.children.stopping

    @property
    def restarts(self) -> int:
        return self.children.restarts

    # -- the main loop --------------------------------------------------------------

    def run(self) -> int:
        logger.info("supervisor started supervisor=%s processes=%d pid=%d", self.name,
                    self.processes, os.getpid())
        try:
            self.children.run(self._tick)
        finally:
            forget(self.broker, self.name)
        logger.info("supervisor stopped supervisor=%s restarts=%d", self.name, self.restarts)
        return EXIT_FORCED if self.children.forced else EXIT_OK

    def _tick(self, now: float) -> float:
        """Each turn of the loop: the burst's end, the heartbeat; seconds to sleep."""
        if self.children.stopping and not self._said_stopping:
            self._said_stopping = True
            logger.info("supervisor stopping supervisor=%s", self.name)
        if self.burst and not self.children.stopping and not self.children.pending(WORKER):
            logger.info("burst done supervisor=%s", self.name)
            self.request_stop()
            return 0.0
        if now >= self._next_beat:
            self._record_alive()
            self._next_beat = now + HEARTBEAT
        return max(0.0, self._next_beat - time.monotonic())

    def _record_alive(self) -> None:
        live = self.children.running(WORKER)
        try:
            record_alive(self.broker, self.name, 60, {
                "role": "supervisor", "queues": ",".join(self.queues),
                "concurrency": self.concurrency or "", "processes": self.processes,
                "threads": len(live),  # live worker children, for delayq_health
                "children": ",".join(str(c.proc.pid) for c in live if c.proc is not None),
                "restarts": self.restarts,
            })
        except REDIS_ERRORS as exc:
            logger.warning("supervisor heartbeat failed supervisor=%s error=%s", self.name, exc)
