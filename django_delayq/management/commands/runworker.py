"""``manage.py runworker``: run django-delayq jobs.

This process is the *host* (:mod:`django_delayq.runtime.host`): it runs no job. It keeps
``--processes`` worker processes running (one by default; each a
:class:`~django_delayq.worker.Worker` with ``--concurrency`` threads, started fresh by
:mod:`django_delayq.worker.process`), restarts one that dies or exits to be replaced
(a job past its hard time limit, a recycle), and runs the background loops on its own
threads (:mod:`django_delayq.services`: the model mirror unless ``--no-mirror``, the
outbox relay, the lake export, the periodic scheduler).

Exit codes (:mod:`django_delayq.runtime.worker.exit_codes`): 0 after a clean stop (first
SIGTERM/SIGINT/SIGHUP, or ``--burst`` done); 1 when stopped by a second signal, or when running
jobs outlived the grace period and were handed back. Bad arguments exit 1 with a
``CommandError``.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.conf import conf
from django_delayq.connection import get_broker
from django_delayq.engine.keys import validate_queue_name
from django_delayq.engine.logfields import log
from django_delayq.engine.workers import new_worker_name
from django_delayq.runtime.children import Child
from django_delayq.runtime.deadlines import Board, frozen_after
from django_delayq.runtime.host import Host
from django_delayq.services import host_services
from django_delayq.task import registry
from django_delayq.worker.process import (
    ProcessSpec,
    command,
    configure_logging,
    forward_stop_signals,
)


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
                            help=f"this runworker's name, up to {MAX_NAME} characters, no "
                                 "spaces (default host:pid:rand); its worker processes are "
                                 "NAME-0, NAME-1...")
        parser.add_argument("--no-mirror", action="store_true",
                            help="do not run the model mirror (a thread of this process)")
        parser.add_argument("--processes", "-p", type=int, default=None,
                            help="worker processes, each with --concurrency threads, under "
                                 f"this process (default {conf.PROCESSES})")
        parser.add_argument("--async-concurrency", type=int, default=None,
                            help="async def tasks run at once per process, on its event "
                                 f"loop (default {conf.ASYNC_CONCURRENCY})")
        parser.add_argument("--max-jobs-per-child", type=int, default=None,
                            help="replace a worker process after about this many jobs")
        parser.add_argument("--max-memory-per-child", type=float, default=None, metavar="MIB",
                            help="replace a worker process once its resident memory "
                                 "reaches this many MiB")

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(self.stderr._out, options["verbosity"])
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
        check_bounds(processes, options["concurrency"] or conf.CONCURRENCY,
                     options["async_concurrency"] or conf.ASYNC_CONCURRENCY)
        max_jobs = options["max_jobs_per_child"] or conf.MAX_JOBS_PER_CHILD
        max_memory = options["max_memory_per_child"] or conf.MAX_MEMORY_PER_CHILD
        if options["max_jobs_per_child"] is not None and options["max_jobs_per_child"] < 1:
            raise CommandError("--max-jobs-per-child must be at least 1")
        if options["max_memory_per_child"] is not None and not (
                options["max_memory_per_child"] >= 1):  # NaN too
            raise CommandError("--max-memory-per-child must be at least 1 (MiB)")
        if not queues and not len(registry):
            self.stderr.write("No tasks are registered; serving the default queue.")
        served = list(queues or registry.queues() or [conf.DEFAULT_QUEUE])
        name = options["name"]
        host_name = name or new_worker_name()
        worker_options = {key: options[key] for key in WORKER_OPTIONS
                          if options[key] is not None}
        worker_options["burst"] = options["burst"]
        slots = ((options["concurrency"] or conf.CONCURRENCY)
                 + (options["async_concurrency"] or conf.ASYNC_CONCURRENCY))
        children = []
        for slot in range(processes):
            worker = f"{host_name}-{slot}"
            board = Board.create(slots)
            spec = ProcessSpec(queues=list(queues), host=host_name, host_pid=os.getpid(),
                               verbosity=options["verbosity"],
                               options={**worker_options, "name": worker},
                               max_jobs=max_jobs, max_memory=max_memory,
                               board_fd=board.fd, board_slots=slots)
            child = Child(slot, *command(spec), worker=worker, board=board,
                          frozen_after=frozen_after(options["lease"] or conf.LEASE))
            child.on_exit.append(forget_metrics_of)
            children.append(child)
        services = host_services(host_name, mirror=not options["no_mirror"],
                                 scheduler_queues=[] if options["burst"] else served)
        grace = conf.GRACE_PERIOD if options["grace_period"] is None else options["grace_period"]
        host = Host(broker=get_broker(), children=children, services=services,
                    name=host_name, burst=options["burst"], queues=served,
                    stop_within=grace,
                    info={"queues": ",".join(served),
                          "concurrency": options["concurrency"] or conf.CONCURRENCY})
        forward_stop_signals(host.request_stop)
        code = host.run()
        if code:
            sys.exit(code)


#: Longest ``--name``: it is kept with every job the worker runs, and in its log lines.
MAX_NAME = 200


def check_bounds(processes: int, concurrency: int, async_concurrency: int) -> None:
    """Refuse a pool no machine runs well (a typo's ``--processes 100000`` would start
    Django that many times), unless ``DELAYQ["MAX_PROCESSES"]`` / ``["MAX_CONCURRENCY"]``
    say this machine can."""
    most = conf.MAX_PROCESSES or max(8, 4 * (os.cpu_count() or 1))
    if processes > most:
        raise CommandError(
            f"--processes {processes} is above DELAYQ['MAX_PROCESSES'] ({most}"
            f"{'' if conf.MAX_PROCESSES else ': 4 per CPU, at least 8'}): set it higher if "
            f"this machine runs that many worker processes")
    for option, value in (("--concurrency", concurrency),
                          ("--async-concurrency", async_concurrency)):
        if value > conf.MAX_CONCURRENCY:
            raise CommandError(
                f"{option} {value} is above DELAYQ['MAX_CONCURRENCY'] "
                f"({conf.MAX_CONCURRENCY}): raise that setting if a process runs that many "
                f"jobs at once")


def forget_metrics_of(child: Child, pid: int, code: int) -> None:
    """Drop an ended worker process's live gauges from prometheus_client's multiprocess
    files (its counters stay: what it counted still counts), when
    ``PROMETHEUS_MULTIPROC_DIR`` is set (docs/metrics.md)."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return
    try:
        from prometheus_client import multiprocess  # the metrics extra: optional
    except ImportError:
        return
    try:
        multiprocess.mark_process_dead(pid)
    except OSError as exc:  # the directory went away: nothing of the child is left there
        log(logging.getLogger("django_delayq.worker"), logging.WARNING,
            "could not drop the metrics of a worker process", pid=pid, error=exc)


#: Options the worker processes take as given (the rest read their settings).
WORKER_OPTIONS = ("concurrency", "lease", "timeout", "grace_period", "prefetch",
                  "async_concurrency")


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
