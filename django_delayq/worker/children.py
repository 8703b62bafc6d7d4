"""Child processes kept running: the pool's worker processes and the mirror process.

:class:`Children` starts each child, restarts one that dies (with backoff), and stops
them in order: the workers first, the mirror once they are gone, so that it mirrors
their last events too. The pool's supervisor (:mod:`.supervisor`) drives one for its
workers and its mirror; a single ``runworker`` drives one for its mirror alone
(:mod:`.mirror_process`).

Children are fresh interpreters (``python -m django NAME ...``), not forks: a fork of a
Django process copies its open database connections, Redis sockets and the locks other
threads hold at that instant, and each of those is a way for a child to corrupt a
connection it shares with its parent or to hang on a lock no thread will release. A new
interpreter costs a Django start-up (well under a second) at each (re)start only.

Children run in their own session, so a Ctrl-C in a terminal reaches their parent
alone (which passes it on once, not twice). A worker child watches its parent's pid and
stops warmly if the parent disappears (SIGKILL, OOM killer). A mirror child reads its
stdin, a pipe from its parent: end of file (the parent closed it to stop the mirror,
or died) stops it warmly, and unlike a signal it cannot arrive before the child is
ready to handle it, however early the stop comes.

Stops: the first stop request sends SIGTERM to every worker child (each finishes its
running jobs within the grace period and hands back the rest), then closes the mirror's
stdin once the workers are gone (it mirrors what is left, at most 5 s). A second
request sends SIGTERM to every child (each exits at once, as after a second signal) and
kills what is left after :data:`KILL_AFTER` seconds.
"""

from __future__ import annotations

import contextlib
import logging
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
from dataclasses import dataclass

from django.conf import settings

from .recycle import EXIT_RECYCLE

logger = logging.getLogger("django_delayq.worker")

#: A child that dies sooner than this after its start died "quickly": the restart waits
#: FIRST_RESTART_DELAY, doubling with each quick death in a row, up to MAX_RESTART_DELAY.
QUICK_DEATH = 10.0
FIRST_RESTART_DELAY = 1.0
MAX_RESTART_DELAY = 30.0
#: After a second stop request, children still running this many seconds are killed.
KILL_AFTER = 5.0
#: The main loop's longest sleep: a missed SIGCHLD is noticed this late at worst.
POLL = 0.5
#: Seconds between two checks of a child that its parent is still its parent.
PARENT_CHECK = 1.0

WORKER = "worker"
MIRROR = "mirror"


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
    env["PYTHONPATH"] = os.pathsep.join(project_paths(sys.path))
    return [sys.executable, "-m", "django", name, *args], env


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


@dataclass
class Child:
    """One slot: the process running in it now, and its restart state."""

    kind: str  # WORKER or MIRROR
    slot: int
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    quick_deaths: int = 0
    start_at: float | None = 0.0  # monotonic time of the next start; None: never again
    clean: bool = True  # its last exit lost nothing (0, recycle, or SIGTERM before start)
    told: bool = False  # asked to stop warmly (the mirror is asked after the workers)

    @property
    def label(self) -> str:
        return f"{self.kind}-{self.slot}"

    def tell_stop(self) -> None:
        """Ask the process to stop warmly: SIGTERM for a worker, end of file on its
        stdin for a mirror."""
        self.told = True
        if self.proc is None:
            return
        if self.kind == MIRROR:
            if self.proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
            return
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)


class Children:
    """Starts, watches and stops child processes; :meth:`run` drives them on one
    thread. :meth:`request_stop` and :meth:`wake` are safe from a signal handler and
    from any thread (no lock: one write to a pipe)."""

    def __init__(self, children: list[Child], *, name: str) -> None:
        self.children = children
        self.name = name  # the owner, in log lines
        self.restarts = 0
        self._requests = 0  # stop requests so far
        self._handled = 0  # stop requests acted on
        self._kill_at: float | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)

    # -- control ------------------------------------------------------------------

    def request_stop(self) -> None:
        """First call: warm stop; second: cold stop."""
        self._requests += 1
        self.wake()

    def wake(self) -> None:
        """Make the loop look at the children now (after SIGCHLD, say)."""
        with contextlib.suppress(OSError):  # a full pipe: the loop is waking anyway
            os.write(self._wake_w, b"x")

    @property
    def stopping(self) -> bool:
        return self._handled > 0

    @property
    def forced(self) -> bool:
        """Whether the stop was cold, or a worker child running at the stop lost jobs
        as it exited."""
        return self._handled > 1 or not all(c.clean for c in self.children
                                            if c.kind == WORKER)

    def running(self, kind: str | None = None) -> list[Child]:
        return [c for c in self.children if c.proc is not None and kind in (None, c.kind)]

    def pending(self, kind: str) -> list[Child]:
        """Children of ``kind`` running or due to (re)start."""
        return [c for c in self.children
                if c.kind == kind and (c.proc is not None or c.start_at is not None)]

    # -- the loop -------------------------------------------------------------------

    def run(self, tick: Callable[[float], float] | None = None) -> None:
        """Keep the children running until they have stopped after a stop request.
        ``tick(now)`` is called on each turn and returns the most seconds to sleep
        before the next (it may call :meth:`request_stop`)."""
        try:
            while True:
                now = time.monotonic()
                self._reap(now)
                if self._requests > self._handled:
                    self._on_stop_request()
                if self.stopping:
                    self._advance_stop(now)
                    if not self.running():
                        break
                else:
                    self._start_due(now)
                sleep = POLL if tick is None else min(POLL, tick(now))
                self._sleep(min(sleep, self._next_start() - time.monotonic()))
        finally:
            for child in self.children:  # an exception above must not orphan children
                if child.proc is not None and child.proc.poll() is None:
                    child.proc.kill()
                    child.proc.wait()
                self._close_stdin(child)
            # a late wake() (a signal handler, a second stop) then writes to no fd, never
            # to one the process has opened since under the same number
            wake_r, wake_w = self._wake_r, self._wake_w
            self._wake_r = self._wake_w = -1
            os.close(wake_r)
            os.close(wake_w)

    def _sleep(self, timeout: float) -> None:
        ready, _, _ = select.select([self._wake_r], [], [], max(0.0, timeout))
        if ready:
            os.read(self._wake_r, 4096)

    def _next_start(self) -> float:
        times = [c.start_at for c in self.children if c.proc is None and c.start_at is not None]
        return min(times, default=time.monotonic() + POLL)

    def _start_due(self, now: float) -> None:
        for child in self.children:
            if child.proc is None and child.start_at is not None and child.start_at <= now:
                self._start(child)

    def _start(self, child: Child) -> None:
        argv, env = django_command(*child.argv)
        stdin = subprocess.PIPE if child.kind == MIRROR else subprocess.DEVNULL
        try:
            child.proc = subprocess.Popen(argv, env=env, stdin=stdin, start_new_session=True)
        except OSError as exc:
            child.quick_deaths += 1
            delay = restart_delay(0.0, child.quick_deaths)
            child.start_at = time.monotonic() + delay
            logger.error("could not start %s, retrying in %.1fs owner=%s error=%s",
                         child.label, delay, self.name, exc)
            return
        child.started = time.monotonic()
        child.start_at = None
        child.told = False
        logger.info("started %s pid=%d owner=%s", child.label, child.proc.pid, self.name)

    @staticmethod
    def _close_stdin(child: Child) -> None:
        if child.proc is not None and child.proc.stdin is not None:
            with contextlib.suppress(OSError):
                child.proc.stdin.close()

    def _reap(self, now: float) -> None:
        for child in self.running():
            assert child.proc is not None
            code = child.proc.poll()
            if code is None:
                continue
            pid = child.proc.pid
            self._close_stdin(child)
            child.proc = None
            forget_metrics_of(pid)
            uptime = now - child.started
            child.clean = code in (0, EXIT_RECYCLE, -signal.SIGTERM)
            if self.stopping:
                level = logging.INFO if child.clean else logging.WARNING
                logger.log(level, "%s stopped pid=%d code=%d owner=%s", child.label,
                           pid, code, self.name)
            elif code == EXIT_RECYCLE:
                child.quick_deaths = 0
                child.start_at = now
                self.restarts += 1
                logger.info("%s recycled pid=%d, starting a fresh one owner=%s",
                            child.label, pid, self.name)
            elif code == 0:
                # it ended by itself (--burst done, or a mirror with no table): not again
                logger.info("%s finished pid=%d owner=%s", child.label, pid, self.name)
            else:
                child.quick_deaths = child.quick_deaths + 1 if uptime < QUICK_DEATH else 0
                delay = restart_delay(uptime, child.quick_deaths)
                child.start_at = now + delay
                self.restarts += 1
                logger.warning("%s died pid=%d code=%d after %.1fs, restarting in %.1fs "
                               "owner=%s", child.label, pid, code, uptime, delay, self.name)

    def _on_stop_request(self) -> None:
        self._handled += 1
        for child in self.children:
            child.start_at = None
            if child.proc is None:
                child.clean = True  # a death before the stop is not the stop's doing
        if self._handled == 1:
            for child in self.running(WORKER):
                child.tell_stop()
            return
        if self._handled == 2:
            logger.warning("second stop request: stopping every child now owner=%s",
                           self.name)
            for child in self.running():
                if child.proc is not None:
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.send_signal(signal.SIGTERM)
            self._kill_at = time.monotonic() + KILL_AFTER

    def _advance_stop(self, now: float) -> None:
        if not self.running(WORKER) and self._handled == 1:
            # after the workers, so that it mirrors their last events too
            for mirror in self.running(MIRROR):
                if not mirror.told:
                    mirror.tell_stop()
        if self._kill_at is not None and now >= self._kill_at:
            for child in self.running():
                if child.proc is not None:
                    with contextlib.suppress(ProcessLookupError):
                        child.proc.kill()
            self._kill_at = None


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
    """Call ``on_gone`` once if this process's parent is no longer ``parent_pid`` (its
    supervisor died and the child was re-parented)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK)
        logger.warning("parent pid=%d is gone: stopping", parent_pid)
        on_gone()

    thread = threading.Thread(target=watch, name="delayq-parent-watch", daemon=True)
    thread.start()
    return thread


def watch_stdin(on_eof: Callable[[], None]) -> threading.Thread:
    """Call ``on_eof`` once this process's stdin (a pipe from its parent) ends: the
    parent closed it to stop this process, or died."""

    def watch() -> None:
        with contextlib.suppress(OSError, ValueError):
            while os.read(sys.stdin.fileno(), 4096):
                pass
        on_eof()

    thread = threading.Thread(target=watch, name="delayq-stdin-watch", daemon=True)
    thread.start()
    return thread
