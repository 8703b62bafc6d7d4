"""``manage.py runworker``: run django-delayq jobs.

Exit codes (:mod:`django_delayq.worker.exit_codes`): 0 after a clean stop (first
SIGTERM/SIGINT, or ``--burst`` done); 1 when stopped by a second signal, or when running
jobs outlived the grace period and were handed back; 75 "restart me": a worker process
stopped to be recycled (``--max-jobs-per-child``, ``--max-memory-per-child``), or it can
no longer run jobs (a job overran its hard time limit, or no executor thread is left),
for its supervisor to start a fresh one. Bad arguments exit 1 with a ``CommandError``.

With ``--processes N`` (N > 1) this process is the pool's supervisor
(:mod:`django_delayq.worker.supervisor`): the same signals and exit codes, for the
whole pool. Otherwise the model mirror runs in a child process of this one
(:mod:`django_delayq.worker.mirror_process`), unless ``--no-mirror``.

The outbox relay and the lake export (``LAKE_PATH``) run once per ``runworker`` (or
pool): in the mirror process, or without one (``--no-mirror``, no Job table) on threads
of this process (the pool's supervisor).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import sys
import threading
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.conf import conf
from django_delayq.engine import workers as liveness
from django_delayq.engine.keys import validate_queue_name
from django_delayq.lake.runner import start_export_thread
from django_delayq.mirror import table_exists
from django_delayq.outbox import RelayThread, start_relay_threads, stop_relay_threads
from django_delayq.task import registry
from django_delayq.worker import EXIT_FORCED, EXIT_RESTART, Worker
from django_delayq.worker.children import watch_parent
from django_delayq.worker.mirror_process import MirrorProcess
from django_delayq.worker.recycle import EXIT_RECYCLE, RecycleMonitor
from django_delayq.worker.supervisor import Supervisor

if TYPE_CHECKING:
    from django_delayq.lake.export import ExportThread

VERBOSITY_LEVELS = {0: logging.WARNING, 1: logging.INFO, 2: logging.DEBUG, 3: logging.DEBUG}


class Command(BaseCommand):
    help = "Run delayed jobs. With no queue names, serves every queue with registered tasks."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE", help="queues to serve")
        parser.add_argument("--concurrency", "-c", type=int, default=None,
                            help=f"jobs run at once, on threads (default {conf.CONCURRENCY})")
        parser.add_argument("--burst", action="store_true",
                            help="run what is due, then exit")
        parser.add_argument("--lease", type=float, default=None,
                            help="seconds a claimed job is leased before another worker may "
                                 "take it back; renewed while it runs")
        parser.add_argument("--grace-period", type=float, default=None,
                            help="seconds running jobs may take to finish after a stop signal")
        parser.add_argument("--prefetch", type=int, default=None,
                            help="jobs claimed ahead of free threads (default: adapts to "
                                 "job run time, from concurrency up to 500)")
        parser.add_argument("--timeout", type=float, default=None,
                            help="time limit in seconds of each attempt of a job whose task "
                                 "sets none (default DELAYQ['TIMEOUT']: "
                                 f"{conf.TIMEOUT or 'no limit'})")
        parser.add_argument("--name", default=None,
                            help=f"worker name: up to {MAX_NAME} characters, no spaces "
                                 "(default host:pid:rand)")
        parser.add_argument("--no-mirror", action="store_true",
                            help="do not run the model mirror (a child process of this "
                                 "one, or of the pool's supervisor)")
        parser.add_argument("--processes", "-p", type=int, default=None,
                            help="worker processes, each with --concurrency threads, under "
                                 f"a supervisor (default {conf.PROCESSES}: no supervisor)")
        parser.add_argument("--async-concurrency", type=int, default=None,
                            help="async def tasks run at once per process, on its event "
                                 f"loop (default {conf.ASYNC_CONCURRENCY})")
        parser.add_argument("--max-jobs-per-child", type=int, default=None,
                            help="replace a worker process after about this many jobs")
        parser.add_argument("--max-memory-per-child", type=float, default=None, metavar="MIB",
                            help="replace a worker process once its resident memory "
                                 "reaches this many MiB")
        # set by the supervisor on the command lines of its children
        parser.add_argument("--supervisor", default=None, help=argparse.SUPPRESS)
        parser.add_argument("--supervisor-pid", type=int, default=None, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(self, options["verbosity"])
        queues = options["queues"]
        for name in queues:
            try:
                validate_queue_name(name)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        check_options(options)
        if options["async_concurrency"] is not None and options["async_concurrency"] < 1:
            raise CommandError("--async-concurrency must be at least 1")
        processes = conf.PROCESSES if options["processes"] is None else options["processes"]
        if processes < 1:
            raise CommandError("--processes must be at least 1")
        max_jobs = options["max_jobs_per_child"] or conf.MAX_JOBS_PER_CHILD
        max_memory = options["max_memory_per_child"] or conf.MAX_MEMORY_PER_CHILD
        if options["max_jobs_per_child"] is not None and options["max_jobs_per_child"] < 1:
            raise CommandError("--max-jobs-per-child must be at least 1")
        if options["max_memory_per_child"] is not None and not (
                options["max_memory_per_child"] >= 1):  # NaN too
            raise CommandError("--max-memory-per-child must be at least 1 (MiB)")
        if not queues and not len(registry):
            self.stderr.write("No tasks are registered; serving the default queue.")
        if processes > 1 and options["supervisor"] is None:
            self._run_pool(options, processes, max_jobs, max_memory)
            return
        worker = Worker(
            queues or None,
            concurrency=options["concurrency"],
            burst=options["burst"],
            lease=options["lease"],
            grace_period=options["grace_period"],
            prefetch=options["prefetch"],
            name=options["name"],
            timeout=options["timeout"],
            async_concurrency=options["async_concurrency"],
        )
        signals = self._install_signal_handlers(worker)
        if options["supervisor"] is not None:
            liveness.PROCESS_INFO["supervisor"] = options["supervisor"]
        if options["supervisor_pid"] is not None:
            watch_parent(options["supervisor_pid"], worker.request_stop)
        recycle = None
        if max_jobs is not None or max_memory is not None:
            recycle = RecycleMonitor(worker, max_jobs=max_jobs, max_memory_mib=max_memory)
        mirror = None
        if not options["no_mirror"]:
            # in a process of its own: writing rows here would slow the jobs down
            mirror = start_mirror_process(worker.name, options["verbosity"])
        # The outbox relay and the lake export run in the mirror process, or in the
        # pool's (a pool's worker runs neither); without one, here.
        here = mirror is None and options["supervisor"] is None
        side = SideThreads.start() if here else SideThreads()
        try:
            # its mirror consumes as <worker>/mirror: the worker's record stays until
            # the mirror has stopped, or other mirrors would take its events over
            code = worker.run(keep_record=mirror is not None)
        finally:
            if mirror is not None:
                mirror.stop()  # after the last acks: it mirrors them too
                worker.forget()
            side.stop()  # after the last acks: the lake exports them too
        if code == 0 and recycle is not None and recycle.reason and not signals:
            code = EXIT_RECYCLE  # stopped by a limit, not by a signal: replace me
        if code == EXIT_RESTART:
            # A thread may be stuck in a job for good: leave without waiting for it.
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        if code:
            sys.exit(code)

    def _run_pool(self, options: dict[str, Any], processes: int, max_jobs: int | None,
                  max_memory: float | None) -> None:
        """Run as the supervisor of ``processes`` worker processes."""
        worker_args = [*options["queues"], "--no-mirror", "-v", str(options["verbosity"])]
        for option, flag in CHILD_OPTIONS:
            if options[option] is not None:
                worker_args += [flag, str(options[option])]
        if options["burst"]:
            worker_args.append("--burst")
        if max_jobs is not None:
            worker_args += ["--max-jobs-per-child", str(max_jobs)]
        if max_memory is not None:
            worker_args += ["--max-memory-per-child", str(max_memory)]
        mirror_args = None
        if not options["no_mirror"] and mirror_table_exists():
            mirror_args = ["--drain-on-stop", "-v", str(options["verbosity"])]
        supervisor = Supervisor(
            worker_args, processes, mirror_args=mirror_args, queues=options["queues"],
            concurrency=options["concurrency"] or conf.CONCURRENCY, burst=options["burst"],
            name=options["name"],
        )
        if threading.current_thread() is threading.main_thread():
            def on_signal(signum: int, frame: FrameType | None) -> None:
                supervisor.request_stop()

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
            signal.signal(signal.SIGCHLD, lambda signum, frame: supervisor.wake())
        # without a mirror process, the supervisor runs the relay and the lake export
        side = SideThreads.start() if mirror_args is None else SideThreads()
        try:
            code = supervisor.run()
        finally:
            side.stop()
        if code:
            sys.exit(code)

    def _install_signal_handlers(self, worker: Worker) -> list[int]:
        """First SIGTERM/SIGINT: warm stop; second: exit at once. Returns the list the
        handler appends each signal to."""
        received: list[int] = []
        if threading.current_thread() is not threading.main_thread():
            return received

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # counted here, not read from worker.stopping: a recycle stops the worker
            # too, and a signal during a recycle is a first signal, not a second
            received.append(signum)
            if len(received) > 1:
                logging.getLogger("django_delayq").warning(
                    "second signal %s: exiting now", signal.Signals(signum).name)
                os._exit(EXIT_FORCED)
            worker.request_stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        return received


#: Longest ``--name``: it is kept with every job the worker runs, and in its log lines.
MAX_NAME = 200


def mirror_table_exists() -> bool:
    """Whether the mirror's Job table exists; when not (no ``migrate`` yet), say once
    that the mirror is off, so that no process is started for nothing."""
    from django.db import connection

    try:
        exists = table_exists()
    finally:
        connection.close()  # this thread runs the worker: no connection held for nothing
    if not exists:
        logging.getLogger("django_delayq.worker").warning(
            "the mirror is off: the Job table is missing (run manage.py migrate)")
    return exists


def start_mirror_process(worker_name: str, verbosity: int) -> MirrorProcess | None:
    """The mirror process of a single worker; None without the Job table."""
    if not mirror_table_exists():
        return None
    return MirrorProcess(worker_name, verbosity=verbosity).start()


@dataclass
class SideThreads:
    """The outbox relay (unless ``DELAYQ["OUTBOX"]["RELAY"]`` is False) and the lake
    export (when ``DELAYQ["LAKE_PATH"]`` is set) of a process with no mirror process to
    run them: one of each per ``runworker`` or pool."""

    relays: list[RelayThread] = field(default_factory=list)
    lake: ExportThread | None = None

    @classmethod
    def start(cls) -> SideThreads:
        return cls(start_relay_threads(known_tasks=registry), start_export_thread())

    def stop(self) -> None:
        stop_relay_threads(self.relays)
        if self.lake is not None:
            self.lake.stop(timeout=5.0, drain=True)


#: Options a supervisor passes on to its worker processes as they were given.
CHILD_OPTIONS = [("concurrency", "--concurrency"), ("lease", "--lease"), ("timeout", "--timeout"),
                 ("grace_period", "--grace-period"), ("prefetch", "--prefetch"),
                 ("async_concurrency", "--async-concurrency")]


def check_options(options: dict[str, Any]) -> None:
    """Refuse values no worker can run with, before anything starts."""

    def number(name: str, *, minimum: float, inclusive: bool) -> None:
        value = options[name.replace("-", "_")]
        if value is None:
            return
        ok = math.isfinite(value) and (value >= minimum if inclusive else value > minimum)
        if not ok:
            relation = "at least" if inclusive else "more than"
            raise CommandError(f"--{name} must be {relation} {minimum:g} (a finite number), "
                               f"not {value!r}")

    number("concurrency", minimum=1, inclusive=True)
    number("lease", minimum=0, inclusive=False)
    number("grace-period", minimum=0, inclusive=True)
    number("prefetch", minimum=0, inclusive=True)
    number("timeout", minimum=0, inclusive=False)
    name = options["name"]
    if name is not None:
        if not name:
            raise CommandError("--name must not be empty (leave it out for host:pid:random)")
        if len(name) > MAX_NAME:
            raise CommandError(f"--name must be at most {MAX_NAME} characters, not {len(name)}")
        if not name.isprintable() or any(c.isspace() for c in name):
            raise CommandError(f"--name must have no spaces or control characters (it shows "
                               f"in key=value log lines), not {name!r}")


def configure_logging(command: BaseCommand, verbosity: int) -> None:
    """Send django_delayq logs to the command's stderr unless logging is configured."""
    logger = logging.getLogger("django_delayq")
    logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.INFO))
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(command.stderr._out)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
