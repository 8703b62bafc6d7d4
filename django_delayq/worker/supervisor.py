"""The process pool of ``runworker --processes N``: a supervisor and its children.

The supervisor runs no job. It starts N worker processes (each a normal ``runworker``
with its threads) and, unless the mirror is off, one ``delayq_mirror`` process; it
restarts a child that dies, forwards stop signals, and records itself in the workers
registry (``role=supervisor``; each child names it in ``supervisor``).

Children are fresh interpreters (``python -m django runworker ...``), not forks: a fork
of a Django process copies its open database connections, Redis sockets and the locks
other threads hold at that instant, and each of those is a way for a child to corrupt a
connection it shares with its parent or to hang on a lock no thread will release. A new
interpreter costs a Django start-up (well under a second) at each (re)start only.

Children run in their own process group, so a Ctrl-C in a terminal reaches the
supervisor alone (the supervisor forwards it once, not twice); each child watches its
parent and stops warmly if the supervisor disappears (SIGKILL, OOM killer).

Stops: the first stop request sends SIGTERM to every worker child (each finishes its
running jobs within the grace period and hands back the rest), then to the mirror once
the workers are gone; ``run()`` returns :data:`EXIT_OK` if every worker stopped cleanly.
A second request sends SIGTERM again (each child exits at once, as a second signal to
``runworker`` does), kills what is left after :data:`KILL_AFTER` seconds, and ``run()``
returns :data:`EXIT_FORCED`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from django.conf import settings

from ..connection import get_broker
from ..engine import Broker
from ..engine.workers import forget, record_alive
from .backoff import REDIS_ERRORS
from .recycle import EXIT_RECYCLE

logger = logging.getLogger("django_delayq.worker")

EXIT_OK = 0
EXIT_FORCED = 1
#: A child that dies sooner than this after its start died "quickly": the restart waits
#: FIRST_RESTART_DELAY, doubling with each quick death in a row, up to MAX_RESTART_DELAY.
QUICK_DEATH = 10.0
FIRST_RESTART_DELAY = 1.0
MAX_RESTART_DELAY = 30.0
#: Seconds between two records of the supervisor in the workers registry.
HEARTBEAT = 5.0
#: After a second stop request, children still running this many seconds are killed.
KILL_AFTER = 5.0
#: The main loop's longest sleep: a missed SIGCHLD is noticed this late at worst.
POLL = 0.5
#: Seconds between two checks of a child that its supervisor is still its parent.
PARENT_CHECK = 1.0


def restart_delay(uptime: float, quick_deaths: int) -> float:
    """Seconds before restarting a child that died after ``uptime`` seconds, the
    ``quick_deaths``-th quick death in a row (0 when it lived long enough)."""
    if uptime >= QUICK_DEATH or quick_deaths <= 0:
        return 0.0
    return min(MAX_RESTART_DELAY, FIRST_RESTART_DELAY * 2 ** (quick_deaths - 1))


def django_command(name: str, *args: str) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run ``manage.py NAME ARGS`` in a new interpreter
    with this process's settings and import path."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
    # manage.py's directory (or the working directory of ``python -m django``) and any
    # --pythonpath are how this process found the project: the child gets them too
    # (the interpreter's own paths it finds by itself).
    own = (sys.prefix, sys.base_prefix, sys.exec_prefix)
    extra = [p or os.getcwd() for p in sys.path if not p.startswith(own) or not p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(extra))
    return [sys.executable, "-m", "django", name, *args], env


@dataclass
class Child:
    """One slot of the pool: the process running in it now, and its restart state."""

    kind: str  # "worker" or "mirror"
    slot: int
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    quick_deaths: int = 0
    start_at: float | None = 0.0  # monotonic time of the next start; None: never again
    clean: bool = True  # its last exit lost nothing (0, recycle, or SIGTERM before start)
    told: bool = False  # sent its stop signal (the mirror's comes after the workers')

    @property
    def label(self) -> str:
        return f"{self.kind}-{self.slot}"


class Supervisor:
    """Starts, watches and stops the children of a pool. Signals are the management
    command's business: it calls :meth:`request_stop` and :meth:`wake`."""

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
        self.children = [Child("worker", i, ["runworker", *worker_args, *common])
                         for i in range(processes)]
        if mirror_args is not None:
            self.children.append(Child("mirror", 0, ["delayq_mirror", *mirror_args]))
        self.restarts = 0
        self._requests = 0  # stop requests so far (signals)
        self._handled = 0  # stop requests acted on
        self._kill_at: float | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    # -- control (safe from a signal handler: no lock, one write) --------------------

    def request_stop(self) -> None:
        """First call: warm stop; second: cold stop."""
        self._requests += 1
        self.wake()

    def wake(self) -> None:
        """Make the main loop look at its children now (after SIGCHLD, say)."""
        with contextlib.suppress(OSError):  # a full pipe: the loop is waking anyway
            os.write(self._wake_w, b"x")

    @property
    def stopping(self) -> bool:
        return self._handled > 0

    # -- the main loop --------------------------------------------------------------

    def run(self) -> int:
        logger.info("supervisor started supervisor=%s processes=%d pid=%d", self.name,
                    self.processes, os.getpid())
        next_beat = 0.0
        try:
            while True:
                now = time.monotonic()
                self._reap(now)
                if self._requests > self._handled:
                    self._on_stop_request()
                if self.stopping:
                    self._advance_stop(now)
                    if not self._running():
                        break
                else:
                    self._start_due(now)
                    if self.burst and not self._pending("worker"):
                        logger.info("burst done supervisor=%s", self.name)
                        self.request_stop()
                        continue
                if now >= next_beat:
                    self._record_alive()
                    next_beat = now + HEARTBEAT
                self._sleep(min(POLL, max(0.0, next_beat - time.monotonic()),
                                self._next_start() - time.monotonic()))
        finally:
            for child in self.children:  # an exception above must not orphan children
                if child.proc is not None and child.proc.poll() is None:
                    child.proc.kill()
                    child.proc.wait()
            forget(self.broker, self.name)
            os.close(self._wake_r)
            os.close(self._wake_w)
        forced = self._handled > 1 or not all(c.clean for c in self.children
                                              if c.kind == "worker")
        logger.info("supervisor stopped supervisor=%s restarts=%d", self.name, self.restarts)
        return EXIT_FORCED if forced else EXIT_OK

    def _sleep(self, timeout: float) -> None:
        ready, _, _ = select.select([self._wake_r], [], [], max(0.0, timeout))
        if ready:
            os.read(self._wake_r, 4096)

    def _running(self, kind: str | None = None) -> list[Child]:
        return [c for c in self.children if c.proc is not None and (kind in (None, c.kind))]

    def _pending(self, kind: str) -> list[Child]:
        """Children of ``kind`` running or due to (re)start."""
        return [c for c in self.children
                if c.kind == kind and (c.proc is not None or c.start_at is not None)]

    def _next_start(self) -> float:
        times = [c.start_at for c in self.children if c.proc is None and c.start_at is not None]
        return min(times, default=time.monotonic() + POLL)

    def _start_due(self, now: float) -> None:
        for child in self.children:
            if child.proc is None and child.start_at is not None and child.start_at <= now:
                self._start(child)

    def _start(self, child: Child) -> None:
        argv, env = django_command(*child.argv)
        try:
            child.proc = subprocess.Popen(argv, env=env, start_new_session=True)
        except OSError as exc:
            child.quick_deaths += 1
            delay = restart_delay(0.0, child.quick_deaths)
            child.start_at = time.monotonic() + delay
            logger.error("could not start %s, retrying in %.1fs supervisor=%s error=%s",
                         child.label, delay, self.name, exc)
            return
        child.started = time.monotonic()
        child.start_at = None
        child.told = False
        logger.info("started %s pid=%d supervisor=%s", child.label, child.proc.pid, self.name)

    def _reap(self, now: float) -> None:
        for child in self._running():
            assert child.proc is not None
            code = child.proc.poll()
            if code is None:
                continue
            pid = child.proc.pid
            child.proc = None
            forget_metrics_of(pid)
            uptime = now - child.started
            child.clean = code in (0, EXIT_RECYCLE, -signal.SIGTERM)
            if self.stopping:
                level = logging.INFO if child.clean else logging.WARNING
                logger.log(level, "%s stopped pid=%d code=%d supervisor=%s", child.label,
                           pid, code, self.name)
            elif code == EXIT_RECYCLE:
                child.quick_deaths = 0
                child.start_at = now
                self.restarts += 1
                logger.info("%s recycled pid=%d, starting a fresh one supervisor=%s",
                            child.label, pid, self.name)
            elif code == 0:
                # it ended by itself (--burst done, or a mirror with no table): not again
                logger.info("%s finished pid=%d supervisor=%s", child.label, pid, self.name)
            else:
                child.quick_deaths = child.quick_deaths + 1 if uptime < QUICK_DEATH else 0
                delay = restart_delay(uptime, child.quick_deaths)
                child.start_at = now + delay
                self.restarts += 1
                logger.warning("%s died pid=%d code=%d after %.1fs, restarting in %.1fs "
                               "supervisor=%s", child.label, pid, code, uptime, delay,
                               self.name)

    def _on_stop_request(self) -> None:
        self._handled += 1
        for child in self.children:
            child.start_at = None
        if self._handled == 1:
            logger.info("supervisor stopping supervisor=%s", self.name)
            self._signal(self._running("worker"), signal.SIGTERM)
            return
        if self._handled == 2:
            logger.warning("second stop request: stopping every child now supervisor=%s",
                           self.name)
            self._signal(self._running(), signal.SIGTERM)
            self._kill_at = time.monotonic() + KILL_AFTER

    def _advance_stop(self, now: float) -> None:
        mirrors = self._running("mirror")
        if mirrors and not self._running("worker") and self._handled == 1:
            # after the workers, so that it mirrors their last events too
            self._signal([m for m in mirrors if not m.told], signal.SIGTERM)
            for mirror in mirrors:
                mirror.told = True
        if self._kill_at is not None and now >= self._kill_at:
            self._signal(self._running(), signal.SIGKILL)
            self._kill_at = None

    def _signal(self, children: list[Child], signum: int) -> None:
        for child in children:
            if child.proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signum)

    def _record_alive(self) -> None:
        live = self._running("worker")
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


def forget_metrics_of(pid: int) -> None:
    """Drop a dead child's live gauges from prometheus_client's multiprocess files (its
    counters stay: what it counted still counts), when ``PROMETHEUS_MULTIPROC_DIR`` is
    set (docs/metrics.md)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    try:
        from prometheus_client import multiprocess
    except ImportError:
        return
    try:
        multiprocess.mark_process_dead(pid)
    except OSError as exc:  # the directory went away: nothing of the child is left there
        logger.warning("could not drop the metrics of pid=%d error=%s", pid, exc)


def watch_parent(parent_pid: int, on_gone: Callable[[], None]) -> threading.Thread:
    """Call ``on_gone`` once if this process's parent is no longer ``parent_pid`` (the
    supervisor died and the child was re-parented)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK)
        logger.warning("supervisor pid=%d is gone: stopping", parent_pid)
        on_gone()

    thread = threading.Thread(target=watch, name="delayq-parent-watch", daemon=True)
    thread.start()
    return thread
