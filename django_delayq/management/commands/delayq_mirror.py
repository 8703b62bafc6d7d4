"""``manage.py delayq_mirror``: keep the Job table in step with the events streams.

``runworker`` runs this command as a child process of its own by default (the pool of
``runworker --processes`` too); this command runs it alone (``--burst``: mirror what
the streams hold, then exit). SIGTERM/SIGINT stop it after the batch in hand is
written and acknowledged; with ``--drain-on-stop`` it then mirrors what is left, for
at most 5 seconds, unless a second signal comes. As the child of ``runworker`` (or of
the pool's supervisor) it is stopped warmly by the end of its stdin or its parent's
end, and drains then; a signal to it means "now": it stops without draining. The outbox
relay runs on a thread unless ``DELAYQ["OUTBOX"]["RELAY"]`` is False, and the lake
export when ``DELAYQ["LAKE_PATH"]`` is set. Without the Job table (no ``migrate`` yet)
it says so and exits 0.
"""

from __future__ import annotations

import argparse
import signal
import threading
from types import FrameType
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.engine.keys import validate_queue_name
from django_delayq.lake.runner import start_export_thread
from django_delayq.management.commands.runworker import configure_logging
from django_delayq.mirror import Mirror, table_exists
from django_delayq.outbox import start_relay_threads, stop_relay_threads
from django_delayq.task import registry
from django_delayq.worker.children import watch_parent, watch_stdin


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
        parser.add_argument("--drain-on-stop", action="store_true",
                            help="after a stop signal, mirror what is left (at most 5 s) "
                                 "unless a second signal comes")
        # set by runworker (and the pool's supervisor) on the command line of its child:
        # the end of stdin, or the parent's end, stops it like a first signal
        parser.add_argument("--stop-on-eof", action="store_true", help=argparse.SUPPRESS)
        parser.add_argument("--supervisor-pid", type=int, default=None, help=argparse.SUPPRESS)

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging(self, options["verbosity"])
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
        # A second signal means "now": no drain. The end of stdin and the parent's end
        # are warm stops, never a second signal; a child (--stop-on-eof) is stopped
        # warmly by those, so a signal to it is its parent's cold stop: no drain either.
        signals: list[int] = []
        if threading.current_thread() is threading.main_thread():
            def on_signal(signum: int, frame: FrameType | None) -> None:
                signals.append(signum)
                mirror.request_stop()

            signal.signal(signal.SIGTERM, on_signal)
            signal.signal(signal.SIGINT, on_signal)
        if options["stop_on_eof"]:
            watch_stdin(mirror.request_stop)
        if options["supervisor_pid"] is not None:
            watch_parent(options["supervisor_pid"], mirror.request_stop)
        relays = start_relay_threads(known_tasks=registry)  # none if OUTBOX RELAY is False
        lake = start_export_thread()  # none unless DELAYQ["LAKE_PATH"] is set
        try:
            count = mirror.run(burst=options["burst"])
            cold = signals if options["stop_on_eof"] else signals[1:]
            if options["drain_on_stop"] and not cold:
                count += mirror.drain(5.0)  # the last events of the workers that stopped
        finally:
            stop_relay_threads(relays)
            if lake is not None:
                lake.stop(timeout=5.0, drain=True)
        if options["verbosity"]:
            self.stdout.write(f"Mirrored {count} events.")
