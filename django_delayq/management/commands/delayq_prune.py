"""``manage.py delayq_prune``: delete finished job rows from the mirror table.

The mirror prunes rows older than ``MIRROR_RETENTION`` as it runs; this command does the
same on demand (a cron job, a deployment without a mirror loop), by age and by the
newest rows to keep per status. It deletes only finished rows (completed, failed,
cancelled, purged) and, by age, rows of jobs found gone from Redis (``missing``): Redis
stays the source of truth, and a job still to run keeps its row. Exit code 0, with the
rows deleted per status on stdout.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from django_delayq.conf import conf
from django_delayq.engine.status import FINISHED_IN_HISTORY
from django_delayq.mirror import table


class Command(BaseCommand):
    help = "Delete finished job rows from the mirror table, by age and per status."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than", type=float, default=None, metavar="SECONDS",
            help="delete finished rows, and rows of jobs gone from Redis, older than this "
                 "(default DELAYQ['MIRROR_RETENTION']; with --keep only, no age limit)")
        parser.add_argument(
            "--keep", action="append", default=[], metavar="STATUS=N",
            help="keep the newest N finished rows of STATUS and delete the others; "
                 f"repeatable; STATUS one of {', '.join(FINISHED_IN_HISTORY)}")
        parser.add_argument("--queue", default=None, help="prune this queue's rows only")

    def handle(self, *args: Any, **options: Any) -> None:
        keep = _keep(options["keep"])
        seconds = options["older_than"]
        if seconds is None and not keep:
            seconds = conf.MIRROR_RETENTION
        if seconds is not None and seconds < 0:
            raise CommandError("--older-than must be at least 0")
        older_than = None if seconds is None else timezone.now() - dt.timedelta(seconds=seconds)
        if older_than is None and not keep:
            self.stdout.write("Nothing to prune: MIRROR_RETENTION is None and no --keep given.")
            return
        deleted = table.prune(older_than=older_than, keep=keep, queue=options["queue"])
        detail = ", ".join(f"{status} {count}" for status, count in deleted.items())
        self.stdout.write(f"Deleted {sum(deleted.values())} rows"
                          + (f" ({detail})." if detail else "."))


def _keep(given: list[str]) -> dict[str, int]:
    """``--keep STATUS=N`` values as ``{status: N}``; CommandError on a bad one."""
    keep = {}
    for item in given:
        status, sep, count = item.partition("=")
        if not sep or status not in FINISHED_IN_HISTORY or not count.isdecimal():
            raise CommandError(f"--keep {item!r}: write STATUS=N, STATUS one of "
                               f"{', '.join(FINISHED_IN_HISTORY)}, N a whole number")
        keep[status] = int(count)
    return keep
