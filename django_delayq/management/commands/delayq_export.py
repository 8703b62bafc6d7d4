"""``manage.py delayq_export LAKE``: append every queue's events to the job-history lake.

Reads each queue shard's events stream through the lake's own consumer group and writes
date-partitioned Parquet files under ``LAKE`` (a local path or a filesystem URL PyArrow
can write), acknowledging entries once their file is durable. ``--burst`` exports what
the streams hold, then exits. SIGTERM/SIGINT/SIGHUP stop it after the batch in hand. See
docs/lake.md.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.conf import conf
from django_delayq.connection import get_broker
from django_delayq.engine.keys import validate_queue_name
from django_delayq.worker.process import configure_logging, forward_stop_signals


class Command(BaseCommand):
    help = "Append job events from Redis to date-partitioned Parquet files (the lake)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("lake", nargs="?", help="a local path or filesystem URL "
                            "(default DELAYQ['LAKE_PATH'])")
        parser.add_argument("--queue", action="append", dest="queues", default=[],
                            metavar="QUEUE", help="export this queue only (repeatable; "
                            "default: every known queue, refreshed)")
        parser.add_argument("--burst", action="store_true",
                            help="export what the streams hold, then exit")
        parser.add_argument("--batch-size", type=int, default=2_000,
                            help="stream entries read per batch (a batch is written as "
                            "files of at most about 250,000 events)")
        parser.add_argument("--claim-idle", type=float, default=60.0,
                            help="seconds another exporter's unacknowledged entries may "
                                 "sit before this one takes them")
        parser.add_argument("--name", default=None, help="consumer name in the group "
                            "(default host:pid:rand); reuse a name to re-read its "
                            "unacknowledged entries at once")

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(self.stderr._out, options["verbosity"])
        where = options["lake"] or conf.LAKE_PATH
        if not where:
            raise CommandError("give the lake's path or URL, or set DELAYQ['LAKE_PATH']")
        for name in options["queues"]:
            try:
                validate_queue_name(name)
            except ValueError as exc:
                raise CommandError(str(exc)) from None
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        if options["claim_idle"] < 0:
            raise CommandError("--claim-idle must be 0 or more")
        if conf.EVENTS_MAXLEN == 0:
            raise CommandError("DELAYQ['EVENTS_MAXLEN'] is 0: no events are recorded")
        try:  # the lake needs PyArrow: an optional extra, imported when the command runs
            from django_delayq.lake import Exporter
        except ImportError as exc:

            raise CommandError(f"{exc} (pip install 'django-delayq[spark]')") from None
        try:
            exporter = Exporter(where,
                                broker=get_broker(socket_timeout=1.0 + conf.SOCKET_TIMEOUT),
                                name=options["name"], batch_size=options["batch_size"],
                                claim_idle=options["claim_idle"],
                                queues=options["queues"] or None)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        forward_stop_signals(exporter.request_stop)
        exporter.run(burst=options["burst"])
        if options["verbosity"]:
            self.stdout.write(
                f"Exported {exporter.entries} entries ({exporter.rows} events) in "
                f"{exporter.files} files; {exporter.lost} trimmed before export, "
                f"{exporter.skipped} garbled.")
        if exporter.lost:
            self.stderr.write(f"{exporter.lost} events were trimmed from the streams before "
                              "they were exported: raise DELAYQ['EVENTS_MAXLEN'].")
