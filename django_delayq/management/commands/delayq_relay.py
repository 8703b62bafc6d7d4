"""``manage.py delayq_relay``: send the jobs waiting in the outbox to Redis.

``runworker`` and ``delayq_mirror`` run the same relay on a thread by default
(``DELAYQ["OUTBOX"]["RELAY"]``); this command runs it alone. ``--burst`` sends what is
waiting and exits. Exit codes: 0 after a clean stop (SIGTERM/SIGINT/SIGHUP, or ``--burst``
done); 1 when ``--burst`` gave up after 3 failed rounds in a row (Redis or the database
unreachable: the rows stay and are sent by the next run).
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections

from django_delayq.outbox import Relay
from django_delayq.task import registry
from django_delayq.worker.process import configure_logging, forward_stop_signals


class Command(BaseCommand):
    help = "Send the jobs waiting in the transactional outbox to Redis."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--burst", action="store_true",
                            help="send what is waiting, then exit")
        parser.add_argument("--database", default=DEFAULT_DB_ALIAS,
                            help="database alias whose outbox to read (default 'default')")
        parser.add_argument("--chunk-size", type=int, default=None,
                            help="rows per round trip (default DELAYQ['OUTBOX']['CHUNK_SIZE'])")

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(self.stderr._out, options["verbosity"])
        if options["database"] not in connections:
            raise CommandError(f"unknown database alias {options['database']!r}")
        if options["chunk_size"] is not None and options["chunk_size"] < 1:
            raise CommandError("--chunk-size must be at least 1")
        relay = Relay(using=options["database"], chunk_size=options["chunk_size"],
                      known_tasks=registry)
        forward_stop_signals(relay.request_stop)
        relay.run(burst=options["burst"])
        if options["verbosity"]:
            self.stdout.write(f"Relayed {relay.sent} rows ({relay.added} new jobs, "
                              f"{relay.duplicates} already in Redis), parked {relay.parked}.")
        if options["burst"] and relay.last_error is not None:
            self.stderr.write(f"Stopped on an error; the rows left wait for the next run: "
                              f"{type(relay.last_error).__name__}: {relay.last_error}")
            sys.exit(1)
