"""A worker process: what a host starts, one per ``--processes`` (one by default).

The entry point is ``python -m django_delayq.worker.process SPEC``, SPEC being the JSON
of a :class:`ProcessSpec` (:func:`command` builds the line, with the host's settings
module and import path in the environment). It sets Django up, runs a :class:`Worker`
with the host's options until a stop, and exits with the worker's code
(:mod:`~django_delayq.runtime.worker.exit_codes`), which the host answers. It is an
internal entry point: the host's command line is the one to use.

Signals: Ctrl-C in a terminal reaches the whole process group; the process ignores it,
and its host passes the stop on. SIGTERM (or SIGHUP) is a warm stop, a second one exits
at once.
If the host disappears (SIGKILL, the OOM killer), the process stops warmly by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any

import django
from django.conf import settings

from ..engine import workers as liveness
from ..engine.logfields import log
from ..runtime.children import python_command, watch_parent
from ..runtime.deadlines import Board
from ..runtime.worker.exit_codes import EXIT_FORCED
from ..runtime.worker.recycle import RecycleMonitor
from . import Worker

VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


@dataclass(frozen=True)
class ProcessSpec:
    """What a worker process needs of its host (JSON: it crosses on the command line)."""

    #: Queues to serve (empty: every queue of the registered tasks).
    queues: list[str]
    #: The host's name and pid (the process names it in its record, and watches it).
    host: str
    host_pid: int
    verbosity: int = 1
    #: :class:`~django_delayq.worker.Worker`'s keyword options (runworker's).
    options: dict[str, Any] = field(default_factory=dict)
    max_jobs: int | None = None
    max_memory: float | None = None
    #: The descriptor of the deadline board shared with the host, and its slots
    #: (:mod:`~django_delayq.runtime.deadlines`; None: not watched).
    board_fd: int | None = None
    board_slots: int = 0


def command(spec: ProcessSpec) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of a worker process running ``spec``."""
    return python_command(__name__, json.dumps(dataclasses.asdict(spec)),
                          env={"DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE})


def configure_logging(stream: IO[str], verbosity: int) -> None:
    """Send django_delayq logs to ``stream`` unless logging is configured."""
    logger = logging.getLogger("django_delayq")
    logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.INFO))
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)


def run_worker_process(spec: ProcessSpec) -> None:
    """The target of a worker process; exits with the worker's code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the host passes Ctrl-C on
    board = None
    if spec.board_fd is not None:
        board = Board(spec.board_fd, spec.board_slots)
        board.keep_stamping(threading.Event())  # until the process ends
    django.setup()  # imports every app's tasks module: the registry fills
    configure_logging(sys.stderr, spec.verbosity)
    liveness.PROCESS_INFO["supervisor"] = spec.host
    worker = Worker(spec.queues or None, board=board, **spec.options)
    install_stop_signals(worker.request_stop)
    watch_parent(spec.host_pid, worker.request_stop)
    if spec.max_jobs is not None or spec.max_memory is not None:
        RecycleMonitor(worker, max_jobs=spec.max_jobs, max_memory_mib=spec.max_memory)
    exit_now(worker.run())


#: The signals that ask for a warm stop (a second one: a cold stop). SIGHUP too: a closed
#: terminal or a process manager sends it, and nothing here reloads on it.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


#: The stop handler of this process (the last one :func:`on_stop_signals` was given).
_stop_handler: Callable[[int, FrameType | None], Any] | None = None
#: The pipe's write end, this process's wakeup fd: each signal's number comes through it.
_signal_pipe: int | None = None


def _noted(signum: int, frame: FrameType | None) -> None:
    """The Python part of the handler, which has nothing left to do: the C part already
    wrote ``signum`` to the wakeup fd (:func:`signal.set_wakeup_fd`), on whichever thread
    the kernel gave the signal to. This part runs only when the main thread next runs
    Python code, which an idle main thread blocked in a system call may not do for
    minutes; and a handler there that took a lock the interrupted code holds (an Event's,
    a logging stream's) would wait for ever. Should another library have replaced the
    wakeup fd, the signal is passed on here, late, and the fd taken back."""
    if _signal_pipe is None:
        return
    if signal.set_wakeup_fd(_signal_pipe, warn_on_full_buffer=False) != _signal_pipe:
        with contextlib.suppress(OSError):  # a full pipe: stops are on their way already
            os.write(_signal_pipe, bytes([signum]))


def _relay_signals(read_fd: int) -> None:
    """The thread that calls the stop handler for each stop signal the pipe brings: one
    whose handler is still :func:`_noted` (another handler set since takes it over)."""
    while True:
        for signum in os.read(read_fd, 64):
            handler = _stop_handler
            # The wakeup fd brings every handled signal: relay those still handled here.
            if handler is None or signal.getsignal(signum) is not _noted:
                continue
            try:
                handler(signum, None)
            except Exception:  # the next signal must still be relayed
                log(logging.getLogger("django_delayq"), logging.ERROR,
                    "stop signal handler failed", exc_info=True, signal=signum)


def on_stop_signals(handler: Callable[[int, FrameType | None], Any], *,
                    sigint: bool = True) -> None:
    """Call ``handler(signum, None)`` on each of :data:`STOP_SIGNALS` (SIGINT unless
    ``sigint`` is False; SIGHUP unless it is ignored: a process started under ``nohup``
    keeps ignoring it), on a thread of its own (:func:`_noted` says why). Only the main
    thread can install handlers: elsewhere (a command called from a test's thread)
    nothing is."""
    global _stop_handler, _signal_pipe
    if threading.current_thread() is not threading.main_thread():
        return
    _stop_handler = handler
    if _signal_pipe is None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # set_wakeup_fd requires it
        threading.Thread(target=_relay_signals, args=(read_fd,), name="delayq-signals",
                         daemon=True).start()
        _signal_pipe = write_fd
    signal.set_wakeup_fd(_signal_pipe, warn_on_full_buffer=False)
    for signum in STOP_SIGNALS:
        if (signum == signal.SIGINT and not sigint) or (
                signum == signal.SIGHUP and signal.getsignal(signum) is signal.SIG_IGN):
            continue
        signal.signal(signum, _noted)


def _forget_stop_signals() -> None:
    """In a child made by ``os.fork`` without ``exec`` (a task's multiprocessing pool,
    say): the stop handlers and the pipe are the parent's, and a signal to the child
    would stop the parent. The child takes the signals' default actions instead."""
    global _stop_handler, _signal_pipe
    if _signal_pipe is None:
        return
    _stop_handler, _signal_pipe = None, None
    with contextlib.suppress(ValueError):  # forked from a thread Python does not know
        signal.set_wakeup_fd(-1)
        for signum in STOP_SIGNALS:
            if signal.getsignal(signum) is _noted:
                signal.signal(signum, signal.SIG_DFL)


os.register_at_fork(after_in_child=_forget_stop_signals)


def install_stop_signals(request_stop: Any) -> list[int]:
    """First stop signal: ``request_stop()``; second: exit at once with
    :data:`EXIT_FORCED`. Returns the list each signal is appended to."""
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) > 1:
            log(logging.getLogger("django_delayq"), logging.WARNING,
                "second signal: exiting now", signal=signal.Signals(signum).name)
            exit_now(EXIT_FORCED)
        request_stop()

    on_stop_signals(on_signal, sigint=signal.getsignal(signal.SIGINT) is not signal.SIG_IGN)
    return received


def forward_stop_signals(request_stop: Callable[[], None]) -> None:
    """Each of :data:`STOP_SIGNALS` calls ``request_stop()``, each time it comes (a host
    takes the second call as its cold stop): a command's own loop."""
    on_stop_signals(lambda signum, frame: request_stop())


def exit_now(code: int) -> None:
    """Exit with ``code`` without waiting for threads (one may be stuck in a job)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run_worker_process(ProcessSpec(**json.loads(sys.argv[1])))
