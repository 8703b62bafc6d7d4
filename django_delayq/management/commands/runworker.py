"""``manage.py runworker``: run django-delayq jobs.

Exit codes: 0 after a clean stop (first SIGTERM/SIGINT, or ``--burst`` done); 1 when
stopped by a second signal, or when running jobs outlived the grace period and were
handed back.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.conf import conf
from django_delayq.engine.keys import validate_queue_name
from django_delayq.mirror import MirrorThread
from django_delayq.task import registry
from django_delayq.worker import EXIT_FORCED, Worker

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
        parser.add_argument("--name", default=None, help="worker name (default host:pid:rand)")
        parser.add_argument("--no-mirror", action="store_true",
                            help="do not run the model mirror on a thread of this worker")

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(self, options["verbosity"])
        queues = options["queues"]
        for name in queues:
            try:
                validate_queue_name(name)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        if options["concurrency"] is not None and options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if options["lease"] is not None and options["lease"] <= 0:
            raise CommandError("--lease must be more than 0 seconds")
        if not queues and not len(registry):
            self.stderr.write("No tasks are registered; serving the default queue.")
        worker = Worker(
            queues or None,
            concurrency=options["concurrency"],
            burst=options["burst"],
            lease=options["lease"],
            grace_period=options["grace_period"],
            prefetch=options["prefetch"],
            name=options["name"],
        )
        self._install_signal_handlers(worker)
        mirror = None if options["no_mirror"] else MirrorThread().start()
        try:
            code = worker.run()
        finally:
            if mirror is not None:
                mirror.stop(timeout=5.0, drain=True)  # mirror the last events too
        if code:
            sys.exit(code)

    def _install_signal_handlers(self, worker: Worker) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if worker.stopping:
                logging.getLogger("django_delayq").warning(
                    "second signal %s: exiting now", signal.Signals(signum).name)
                os._exit(EXIT_FORCED)
            worker.request_stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)


def configure_logging(command: BaseCommand, verbosity: int) -> None:
    """Send django_delayq logs to the command's stderr unless logging is configured."""
    logger = logging.getLogger("django_delayq")
    logger.setLevel(VERBOSITY_LEVELS.get(verbosity, logging.INFO))
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(command.stderr._out)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s"))
        logger.addHandler(handler)
