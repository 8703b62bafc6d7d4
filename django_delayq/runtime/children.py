"""Worker processes kept running: started, restarted with backoff, stopped in order.

:class:`Children` starts each child as a fresh interpreter running one documented entry
point (``python -m django_delayq.worker.process SPEC``: its :class:`Child` says the
command line and environment), never a fork (a fork of a Django process copies its open
database connections, Redis sockets and the locks other threads hold at that instant),
and never by re-importing this process's main script (as multiprocessing's spawn does:
a ``manage.py`` without a ``__main__`` guard would run again). It restarts a child that
exits without being asked, whatever its code: at once after it asked to be replaced,
else after a backoff when it died young (:data:`QUICK_DEATH`). In burst mode a child
that exits 0 is done.

Stops: the first :meth:`Children.request_stop` sends SIGTERM to each child (a warm stop:
it finishes its running jobs within the grace period and hands back the rest); the
second sends SIGTERM again (a child exits at once on its second), and what is left after
:data:`KILL_AFTER` seconds is killed. Children run in a session of their own (a Ctrl-C
in a terminal reaches the host alone, which passes it on once); a child watches its host
(:func:`watch_parent`) and stops warmly if it is gone.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import site
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..engine.backoff import backoff_delay
from ..engine.logfields import log
from .deadlines import KILL_MARGIN, Board, Posted
from .worker.exit_codes import EXIT_RESTART
from .worker.heartbeat import MAX_INTERVAL as HEARD_WITHIN
from .worker.ledger import ABORT_NOTICE
from .worker.timelimits import HARD_LIMIT_GRACE as ABORT_GRACE

logger = logging.getLogger("django_delayq.worker")

#: A child that dies sooner than this after its start died "quickly": its restart waits,
#: FIRST_RESTART_DELAY doubling with each quick death in a row up to MAX_RESTART_DELAY.
QUICK_DEATH = 10.0
FIRST_RESTART_DELAY = 1.0
MAX_RESTART_DELAY = 30.0
#: After a second stop request, children still running this many seconds are killed;
#: after the first, those still running this long past the stop's deadline.
KILL_AFTER = 5.0
#: The main loop's longest sleep; while a child has a board, the longest between two
#: reads of it.
POLL = 0.5
BOARD_CHECK = 0.25
#: Seconds between two checks of a child that its parent is still its parent.
PARENT_CHECK = 0.5
#: Exit codes that lose nothing: a clean stop, a recycle, a SIGTERM before it was ready.
CLEAN = (0, EXIT_RESTART, -signal.SIGTERM)


def restart_delay(uptime: float, quick_deaths: int) -> float:
    """Seconds before restarting a child that died after ``uptime`` seconds, the
    ``quick_deaths``-th quick death in a row (0 when it lived long enough)."""
    if uptime >= QUICK_DEATH or quick_deaths <= 0:
        return 0.0
    return backoff_delay(quick_deaths, first=FIRST_RESTART_DELAY, cap=MAX_RESTART_DELAY)


def interpreter_paths() -> list[str]:
    """The directories a new interpreter puts on its import path by itself: its
    standard library and site-packages (a virtualenv's and its base's), resolved."""
    found = []
    for scheme in (sysconfig.get_paths(),
                   sysconfig.get_paths(vars={"base": sys.base_prefix,
                                             "platbase": sys.base_exec_prefix})):
        found += [scheme[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")
                  if key in scheme]
    found += site.getsitepackages()
    if site.ENABLE_USER_SITE:
        found.append(site.getusersitepackages())
    return list(dict.fromkeys(os.path.realpath(p) for p in found))


def project_paths(paths: list[str]) -> list[str]:
    """The entries of ``paths`` (``sys.path``) a child needs on its PYTHONPATH: all but
    the interpreter's own (:func:`interpreter_paths`, compared as whole path components,
    so a project in ``/usr/src/app`` is kept under a ``/usr`` prefix) and its zipped
    standard library; '' stands for the working directory."""
    own = interpreter_paths()
    stdlib_zip = f"python{sys.version_info[0]}{sys.version_info[1]}.zip"

    def is_own(path: str) -> bool:
        if os.path.basename(path) == stdlib_zip:
            return True
        real = os.path.realpath(path)
        return any(real == root or real.startswith(root.rstrip(os.sep) + os.sep)
                   for root in own)

    return list(dict.fromkeys(p or os.getcwd() for p in paths if not p or not is_own(p)))


def python_command(module: str, *args: str, env: dict[str, str] | None = None
                   ) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that run ``python -m module ARGS`` in a new interpreter
    with this process's import path: the directories that found the project (a
    ``manage.py``'s, the working directory of ``python -m django``, ``--pythonpath``) go
    on its PYTHONPATH; the interpreter's own it finds by itself."""
    child_env = {**os.environ, **(env or {})}
    child_env["PYTHONPATH"] = os.pathsep.join(project_paths(sys.path))
    return [sys.executable, "-m", module, *args], child_env


@dataclass
class Child:
    """One slot: the command of the process running in it, and its restart state."""

    slot: int
    argv: list[str]
    env: dict[str, str]
    #: The name its worker process runs under (each process of the slot reuses it).
    worker: str | None = None
    #: The deadline board its process posts running jobs on (:mod:`.deadlines`; its
    #: descriptor is passed on), watched with ``frozen_after``: the seconds without a
    #: stamp after which the process is taken for frozen.
    board: Board | None = None
    frozen_after: float = 60.0
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    quick_deaths: int = 0
    start_at: float | None = 0.0  # monotonic time of the next start; None: never again
    clean: bool = True  # its last exit lost nothing
    #: Why it was killed (None: it was not), and the jobs it was running past their hard
    #: limit then, for its host to fail.
    killed_for: str | None = None
    overrun: list[Posted] = field(default_factory=list)
    #: The ``(queue, id)`` of its running jobs whose abort its host saw asked for, and
    #: when (monotonic): if the process never hears of it (one holding the GIL hears
    #: nothing), killed once it should have (:func:`kill_at`).
    aborts: dict[tuple[str, str], float] = field(default_factory=dict)
    #: Called with it, its process's pid and exit code when that process is gone
    #: (however it ended), before a new one starts in its slot.
    on_exit: list[Callable[[Child, int, int], None]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"worker-{self.slot}"

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)


class Children:
    """Starts, watches and stops child processes; :meth:`run` drives them on one thread.
    :meth:`request_stop` and :meth:`wake` are safe from a signal handler and from any
    thread (no lock: one write to a pipe)."""

    def __init__(self, children: list[Child], *, name: str, burst: bool = False,
                 stop_within: float | None = None) -> None:
        self.children = children
        self.name = name  # the owner, in log lines
        self.burst = burst
        #: Seconds a warm stop may take (the workers' grace period); children still
        #: running :data:`KILL_AFTER` seconds past it are killed. None: no bound.
        self.stop_within = stop_within
        self.restarts = 0
        self._requests = 0  # stop requests so far
        self._handled = 0  # stop requests acted on
        self._kill_at: float | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        #: A descriptor per running child that becomes readable when it exits (Linux's
        #: pidfd; elsewhere none, and exits are seen within POLL).
        self._exits: dict[int, int] = {}

    def request_stop(self) -> None:
        """First call: warm stop; second: cold stop."""
        self._requests += 1
        self.wake()

    def wake(self) -> None:
        """Make the loop look at the children now."""
        with contextlib.suppress(OSError):  # a full pipe: the loop is waking anyway
            os.write(self._wake_w, b"x")

    @property
    def stopping(self) -> bool:
        return self._handled > 0

    @property
    def forced(self) -> bool:
        """Whether the stop was cold, or a child running at the stop lost jobs as it
        exited."""
        return self._handled > 1 or not all(c.clean for c in self.children)

    def running(self) -> list[Child]:
        return [c for c in self.children if c.proc is not None]

    def pending(self) -> list[Child]:
        """Children running or due to (re)start."""
        return [c for c in self.children if c.proc is not None or c.start_at is not None]

    def run(self, tick: Callable[[float], float] | None = None) -> None:
        """Keep the children running until they have stopped after a stop request.
        ``tick(now)`` is called on each turn and returns the most seconds to sleep
        before the next (it may call :meth:`request_stop`)."""
        try:
            while True:
                now = time.monotonic()
                self._reap(now)
                while self._requests > self._handled:
                    self._on_stop_request()
                self._watch_boards(now)
                if self.stopping:
                    self._advance_stop(now)
                    if not self.running():
                        break
                else:
                    self._start_due(now)
                sleep = POLL if tick is None else min(POLL, tick(now))
                if any(c.board is not None for c in self.running()):
                    sleep = min(sleep, BOARD_CHECK)
                self._sleep(min(sleep, self._next_start() - time.monotonic()))
        finally:
            for child in self.running():  # an exception above must not orphan children
                child.signal(signal.SIGKILL)
                if child.proc is not None:
                    child.proc.wait()
                    self._gone(child)
            wake_r, wake_w = self._wake_r, self._wake_w
            self._wake_r = self._wake_w = -1
            os.close(wake_r)
            os.close(wake_w)

    def _sleep(self, timeout: float) -> None:
        ready, _, _ = select.select([self._wake_r, *self._exits.values()], [], [],
                                    max(0.0, timeout))
        if self._wake_r in ready:
            os.read(self._wake_r, 4096)

    def _next_start(self) -> float:
        times = [c.start_at for c in self.children if c.proc is None and c.start_at is not None]
        return min(times, default=time.monotonic() + POLL)

    def _start_due(self, now: float) -> None:
        for child in self.children:
            if child.proc is None and child.start_at is not None and child.start_at <= now:
                self._start(child)

    def _start(self, child: Child) -> None:
        if child.board is not None:
            child.board.reset()
        try:
            proc = subprocess.Popen(child.argv, env=child.env, stdin=subprocess.DEVNULL,
                                    start_new_session=True,
                                    pass_fds=() if child.board is None else (child.board.fd,))
        except OSError as exc:
            child.quick_deaths += 1
            delay = restart_delay(0.0, child.quick_deaths)
            child.start_at = time.monotonic() + delay
            log(logger, logging.ERROR, f"could not start {child.label}",
                retry_in_s=round(delay, 1), owner=self.name, error=exc)
            return
        child.proc = proc
        child.started = time.monotonic()
        child.start_at = None
        with contextlib.suppress(AttributeError, OSError):  # no pidfd: polled
            self._exits[proc.pid] = os.pidfd_open(proc.pid)
        log(logger, logging.INFO, f"started {child.label}", pid=proc.pid, owner=self.name)

    def _gone(self, child: Child) -> tuple[int, int]:
        """Forget ``child``'s ended process; its pid and exit code."""
        assert child.proc is not None
        pid, code = child.proc.pid, child.proc.returncode
        child.proc = None
        exit_fd = self._exits.pop(pid, None)
        if exit_fd is not None:
            os.close(exit_fd)
        code = -signal.SIGKILL if code is None else code
        for hook in child.on_exit:
            try:
                hook(child, pid, code)
            except Exception:  # a hook must not stop the others, nor the loop
                log(logger, logging.ERROR, f"after the exit of {child.label}", exc_info=True,
                    pid=pid, owner=self.name)
        child.overrun = []
        child.aborts.clear()
        return pid, code

    def _reap(self, now: float) -> None:
        for child in self.running():
            assert child.proc is not None
            if child.proc.poll() is None:
                continue
            uptime = now - child.started
            killed_for, child.killed_for = child.killed_for, None
            pid, code = self._gone(child)
            child.clean = code in CLEAN
            if killed_for is not None and not self.stopping:
                child.quick_deaths = 0  # its job's doing, not a failing start: at once
                child.start_at = now
                self.restarts += 1
                log(logger, logging.WARNING, f"{child.label} killed", pid=pid,
                    reason=killed_for, then="starting a fresh one", owner=self.name)

            elif self.stopping:
                level = logging.INFO if child.clean else logging.WARNING
                log(logger, level, f"{child.label} stopped", pid=pid, code=code,
                    owner=self.name)
            elif code == 0 and self.burst:
                log(logger, logging.INFO, f"{child.label} finished", pid=pid, owner=self.name)
            elif code == EXIT_RESTART:
                child.quick_deaths = 0
                child.start_at = now
                self.restarts += 1
                log(logger, logging.INFO, f"{child.label} exited to be replaced, starting a "
                    "fresh one", pid=pid, owner=self.name)
            else:
                # unasked, whatever its code (0 included: a task's os._exit(0), a kill)
                child.quick_deaths = child.quick_deaths + 1 if uptime < QUICK_DEATH else 0
                delay = restart_delay(uptime, child.quick_deaths)
                child.start_at = now + delay
                self.restarts += 1
                log(logger, logging.WARNING, f"{child.label} died", pid=pid, code=code,
                    uptime_s=round(uptime, 1), retry_in_s=round(delay, 1), owner=self.name)

    def _on_stop_request(self) -> None:
        self._handled += 1
        for child in self.children:
            child.start_at = None
            if child.proc is None:
                child.clean = True  # a death before the stop is not the stop's doing
        if self._handled == 1:
            for child in self.running():
                child.signal(signal.SIGTERM)
            if self.stop_within is not None:
                self._kill_at = time.monotonic() + self.stop_within + KILL_AFTER
            return
        if self._handled == 2:
            log(logger, logging.WARNING, "second stop request: stopping every child now",
                owner=self.name)
            for child in self.running():
                child.signal(signal.SIGTERM)
            self._kill_at = min(self._kill_at or math.inf, time.monotonic() + KILL_AFTER)

    def _advance_stop(self, now: float) -> None:
        if self._kill_at is not None and now >= self._kill_at:
            for child in self.running():
                log(logger, logging.WARNING, f"{child.label} still running: killed",
                    pid=child.pid, owner=self.name)
                child.signal(signal.SIGKILL)
            self._kill_at = None

    def _watch_boards(self, now: float) -> None:
        """Kill a child whose board shows it frozen: a job posted :data:`KILL_MARGIN`
        seconds past its hard limit (its own watchdog would have failed it by then), or
        no stamp for ``frozen_after`` seconds. Its jobs are its host's to settle (the
        ``on_exit`` hooks see :attr:`Child.overrun`)."""
        for child in self.running():
            board, pid = child.board, child.pid
            if board is None or pid is None or child.killed_for is not None:
                continue
            overrun = [p for p in board.posted()
                       if now >= kill_at(p, child.aborts.get((p.queue, p.job_id)))]
            stamp = board.last_stamp(pid)
            if overrun:
                first = overrun[0]
                asked = child.aborts.get((first.queue, first.job_id))
                why = (f"job {first.job_id} of queue {first.queue} runs "
                       f"{now - first.hard_at:.1f}s past its time limit of "
                       f"{first.timeout:g}s plus grace: C code holding the GIL?"
                       if asked is None and not first.aborted_by else
                       f"job {first.job_id} of queue {first.queue} still runs past its "
                       f"abort's grace: C code holding the GIL?")
            elif stamp is not None and now - stamp >= child.frozen_after:
                why = (f"no Python ran in it for {now - stamp:.0f}s: C code holding the "
                       f"GIL, or a deadlock?")
            else:
                continue
            log(logger, logging.ERROR, f"{child.label} is frozen: killing it", pid=pid,
                reason=why, owner=self.name)
            child.killed_for, child.overrun = why, overrun
            child.signal(signal.SIGKILL)


def kill_at(posted: Posted, abort_noted: float | None) -> float:
    """When a child still running ``posted`` is frozen (monotonic): :data:`KILL_MARGIN`
    past the job's hard limit, which the process moves closer when it hears of an abort.
    One whose abort its host noted at ``abort_noted`` and the process has not heard of
    should have heard within a beat (:data:`HEARD_WITHIN`): it is killed past that, the
    abort's notice and its grace. Killing it sooner would take the process of a job that
    stops in time from its other jobs (they would run again)."""
    hard_at = posted.hard_at
    if abort_noted is not None and not posted.aborted_by:
        hard_at = min(hard_at, abort_noted + HEARD_WITHIN + ABORT_NOTICE + ABORT_GRACE)
    return hard_at + KILL_MARGIN


def watch_parent(parent_pid: int, on_gone: Callable[[], None]) -> threading.Thread:
    """Call ``on_gone`` once if this process's parent is no longer ``parent_pid`` (its
    host died and the child was re-parented)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK)
        log(logger, logging.WARNING, "parent is gone: stopping", parent_pid=parent_pid)

        on_gone()

    thread = threading.Thread(target=watch, name="delayq-parent-watch", daemon=True)
    thread.start()
    return thread
