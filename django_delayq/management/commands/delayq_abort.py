"""``manage.py delayq_abort QUEUE [--] JOB_ID...``: stop jobs, running ones included.

A job that has not started is cancelled at once; a running one is asked to stop
(``Job.abort()``) and ends ``cancelled`` within seconds. With ``--wait S`` the command
waits (at most S seconds in all) until each has ended. Exit codes: 0 every job was
stopped (or asked to stop); 1 a job had finished already, is not in Redis, or still ran
at the end of ``--wait``; 2 bad arguments; 4 Redis is unreachable.
"""

from __future__ import annotations

import getpass
import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_delayq.engine import DelayQConnectionError, Job, JobNotFound
from django_delayq.engine.keys import validate_queue_name
from django_delayq.engine.status import FINISHED

EXIT_OK = 0
EXIT_NOT_STOPPED = 1
EXIT_USAGE = 2
EXIT_REDIS = 4


class Command(BaseCommand):
    help = ("Abort jobs: cancel those that have not started, stop running ones (they end "
            "cancelled). Exit 0 done, 1 a job was finished or missing, 2 bad arguments, "
            "4 Redis unreachable.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("queue", help="the jobs' queue")
        parser.add_argument("job_ids", nargs="+", metavar="job_id",
                            help="the jobs' ids; put -- before them, as an id may start "
                                 "with '-' (generated ids are URL-safe base64)")
        parser.add_argument("--by", default=None,
                            help="who asks, kept with each job (default: this system user)")
        parser.add_argument("--wait", type=float, default=0.0, metavar="SECONDS",
                            help="wait at most this long for each running job to end")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            validate_queue_name(options["queue"])
        except ValueError as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from None
        by = options["by"] or f"{getpass.getuser()} (delayq_abort)"
        code = EXIT_OK
        try:
            jobs = []
            for job_id in options["job_ids"]:
                job = Job(id=job_id, queue=options["queue"])
                try:
                    asked = job.abort(by=by)
                except JobNotFound:
                    self.stderr.write(f"{job_id}: not in Redis")
                    code = EXIT_NOT_STOPPED
                    continue
                if not asked:
                    self.stderr.write(f"{job_id}: {job.status} already, not aborted")
                    code = EXIT_NOT_STOPPED
                    continue
                done = job.status in FINISHED
                self.stdout.write(f"{job_id}: {'cancelled' if done else 'asked to stop'}")
                jobs.append(job)
            deadline = time.monotonic() + options["wait"]
            for job in jobs:
                while job.status not in FINISHED and time.monotonic() < deadline:
                    time.sleep(0.2)
                    job.refresh()
                if options["wait"]:
                    self.stdout.write(f"{job.id}: {job.status}")
                    if job.status not in FINISHED:
                        code = EXIT_NOT_STOPPED
        except DelayQConnectionError as exc:
            self.stderr.write(f"Redis is unreachable: {exc}")
            sys.exit(EXIT_REDIS)
        if code:
            sys.exit(code)
