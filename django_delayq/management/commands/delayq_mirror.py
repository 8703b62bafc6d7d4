"""``manage.py delayq_mirror``: keep the Job table in step with the events streams.

Every ``runworker`` mirrors on a thread of its own process (its host); this command
runs the mirror alone (``--burst``: mirror what the streams hold, then exit), with the
outbox relay (unless ``DELAYQ["OUTBOX"]["RELAY"]`` is False) and the lake export (when
``DELAYQ["LAKE_PATH"]`` is set) beside it, in the same kind of host
(:mod:`django_delayq.runtime.host`). A first SIGTERM/SIGINT/SIGHUP stops it after the batch in
hand is written and acknowledged, then it mirrors what is left (at most 5 seconds); a
second stops it at once. Without the Job table (no ``migrate`` yet) it says so and exits 0.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.connection import get_broker
from django_delayq.engine.keys import validate_queue_name
from django_delayq.mirror import Mirror, table_exists
from django_delayq.runtime.host import Host
from django_delayq.services import SinkService, host_services
from django_delayq.worker.process import configure_logging, forward_stop_signals


class Command(BaseCommand):
    help = "Mirror job events from Redis into the django_delayq Job table."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queues", nargs="*", metavar="QUEUE",
                            help="queues to mirror (default: every known queue, refreshed)")
        parser.add_argument("--burst", action="store_true",
                            help="mirror what the streams hold, then exit")
        parser.add_argument("--batch-size", type=int, default=None,
                            help="events read per batch (default DELAYQ['MIRROR_BATCH_SIZE'])")
        parser.add_argument("--claim-idle", type=float, default=None,
                            help="seconds another mirror's unacknowledged events may sit "
                                 "before this one takes them (default "
                                 "DELAYQ['MIRROR_CLAIM_IDLE'])")
        parser.add_argument("--name", default=None,
                            help="consumer name in the group (default host:pid:rand); reuse "
                                 "a name to re-read its unacknowledged events at once")

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(self.stderr._out, options["verbosity"])
        for name in options["queues"]:
            try:
                validate_queue_name(name)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        if options["batch_size"] is not None and options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        if not table_exists():
            self.stderr.write("The mirror is off: the Job table is missing (run manage.py "
                              "migrate).")
            return
        mirror = Mirror(queues=options["queues"] or None, batch_size=options["batch_size"],
                        claim_idle=options["claim_idle"], name=options["name"])
        if options["burst"]:
            count = mirror.run(burst=True)
        else:
            host = Host(broker=get_broker(), name=mirror.name,
                        services=[SinkService("mirror", mirror),
                                  *host_services(mirror.name, mirror=False)])
            forward_stop_signals(host.request_stop)
            host.run()
            count = mirror.mirrored
        if options["verbosity"]:
            self.stdout.write(f"Mirrored {count} events.")
