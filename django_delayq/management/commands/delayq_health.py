"""``manage.py delayq_health``: exit non-zero when workers are not alive (liveness probes).

Exit codes: 0 every worker checked is alive; 1 one has stopped heartbeating or has no
live thread; 2 bad arguments; 3 no worker matches; 4 Redis is unreachable (or refused
the read).
"""

from __future__ import annotations

import math
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.conf import conf
from django_delayq.connection import get_broker
from django_delayq.engine.errors import CommandRefused, DelayQConnectionError
from django_delayq.engine.keys import validate_queue_name
from django_delayq.runtime.health import check_workers

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_USAGE = 2
EXIT_NO_WORKER = 3
EXIT_REDIS = 4
#: Seconds to wait for Redis (``--timeout``).
DEFAULT_TIMEOUT = 5.0


class Command(BaseCommand):
    help = ("Check that workers are alive: a recent heartbeat and a live thread. Exit 0 "
            "healthy, 1 unhealthy, 2 bad arguments, 3 no such worker, 4 Redis unreachable.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--worker", default=None,
                            help="a worker's name (runworker --name); a supervisor's "
                                 "name covers its worker processes")
        parser.add_argument("--queue", default=None, help="the workers serving this queue")
        parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT,
                            help="seconds to wait for Redis before exiting 4 (default "
                                 f"{DEFAULT_TIMEOUT:g})")
        parser.add_argument("--stale-after", type=float, default=None,
                            help="seconds without a heartbeat after which a worker is "
                                 "dead (default: three of its heartbeat intervals + 1 s, "
                                 "at most 30 s)")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["queue"] is not None:
            try:
                validate_queue_name(options["queue"])
            except ValueError as exc:
                raise CommandError(str(exc), returncode=EXIT_USAGE) from None
        stale_after = options["stale_after"]
        if stale_after is not None and not (math.isfinite(stale_after) and stale_after > 0):
            raise CommandError("--stale-after must be a number of seconds above 0",
                               returncode=EXIT_USAGE)
        timeout = options["timeout"]
        if not (math.isfinite(timeout) and timeout > 0):
            raise CommandError("--timeout must be a number of seconds above 0",
                               returncode=EXIT_USAGE)
        # On a thread of its own: a client retries a refused connection with backoff
        # (through every sentinel, for a Sentinel URL), which a probe cannot wait for.
        answer: list[Any] = []

        def check() -> None:
            try:
                answer.append(check_workers(get_broker(), default_lease=conf.LEASE,
                                            worker=options["worker"], queue=options["queue"],
                                            stale_after=stale_after))
            except (DelayQConnectionError, CommandRefused) as exc:  # or an ACL refused
                answer.append(exc)

        thread = threading.Thread(target=check, name="delayq-health", daemon=True)
        thread.start()
        thread.join(timeout)
        if not answer:
            self.stderr.write(f"Redis did not answer within {timeout:g}s.")
            sys.exit(EXIT_REDIS)
        if isinstance(answer[0], Exception):
            self.stderr.write(" ".join(str(answer[0]).split()))  # one line
            sys.exit(EXIT_REDIS)
        found = answer[0]
        verbose = options["verbosity"] > 0
        if not found:
            if verbose:
                self.stderr.write("No worker matches.")
            sys.exit(EXIT_NO_WORKER)
        for health in found:
            if verbose:
                state = "ok" if health.healthy else f"UNHEALTHY: {health.problem}"
                self.stdout.write(f"{health.role} {health.name} pid={health.pid} "
                                  f"heartbeat={health.age:.1f}s ago threads={health.threads} "
                                  f"{state}")
        if not all(h.healthy for h in found):
            sys.exit(EXIT_UNHEALTHY)
