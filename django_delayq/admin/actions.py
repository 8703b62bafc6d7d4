"""The admin's actions on jobs: what each does to a job in Redis (through the engine's
:class:`~django_delayq.engine.job.Job`), which statuses it applies to, and running one on
the selected rows with a message per outcome (the job list's actions and the job page's
buttons)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.contrib import messages
from django.contrib.admin import ModelAdmin
from django.db.models import QuerySet
from django.http import HttpRequest

from ..engine import DelayQConnectionError, InvalidJobState, JobNotFound
from ..engine import Job as EngineJob
from ..engine.errors import CommandRefused
from ..engine.logfields import log
from ..engine.status import CANCELLABLE, LEASED, PENDING, RETRYABLE
from ..mirror.consumer import refresh_rows
from ..models import Job

logger = logging.getLogger("django_delayq.admin.jobs")

class ReadOnlyPages(ModelAdmin):
    """A model admin whose pages are read-only and whose changes are actions: the admin
    index offers "View", never "Change"."""

    def get_model_perms(self, request: HttpRequest) -> dict[str, bool]:
        return {**super().get_model_perms(request), "change": False,
                "view": self.has_view_or_change_permission(request)}


#: Most jobs one admin action touches (each is one Redis round trip or two).
MAX_ACTION_JOBS = 500
REDIS_DOWN = "Redis is unreachable; nothing was changed. Try again in a moment."


#: What an action does to one job in Redis, given who acts; returns what became of it.
Operation = Callable[[EngineJob, str], str]


def run_now(job: EngineJob, by: str) -> str:
    if job.status in PENDING:
        job.reschedule(delay=0)
        return "moved to now"
    if job.status in RETRYABLE:
        job.retry()
        return "retried"
    raise InvalidJobState(job.id, job.status, "run now", (*PENDING, *RETRYABLE))


def retry(job: EngineJob, by: str) -> str:
    job.retry()
    return "retried"


def cancel(job: EngineJob, by: str) -> str:
    if job.cancel():
        return "cancelled"
    raise InvalidJobState(job.id, job.status, "cancelled", CANCELLABLE)


def abort(job: EngineJob, by: str) -> str:
    """Cancel a job that has not started, ask a running one to stop (it ends cancelled
    within seconds: the job page shows who aborted it)."""
    before = job.status
    if job.abort(by=by):
        return "asked to stop" if before in LEASED else "cancelled"
    raise InvalidJobState(job.id, job.status, "aborted", (*CANCELLABLE, *LEASED))


#: The buttons of the job page: operation -> (verb, what it does to the engine's Job).
JOB_OPERATIONS: dict[str, tuple[str, Operation]] = {
    "retry": ("retried", retry),
    "cancel": ("cancelled", cancel),
    "abort": ("aborted", abort),
    "run-now": ("run now", run_now),
}
#: The statuses each operation applies to (the job page shows only those buttons).
APPLIES_TO = {
    "retry": tuple(RETRYABLE),
    "cancel": tuple(CANCELLABLE),
    "abort": tuple(LEASED),
    "run-now": (*PENDING, *RETRYABLE),
}


def operations_for(status: str) -> list[str]:
    """The job page's buttons for a job in ``status``."""
    return [op for op in JOB_OPERATIONS if status in APPLIES_TO[op]]


def act(model_admin: ModelAdmin[Job], request: HttpRequest, queryset: QuerySet[Job],
        verb: str, operation: Operation) -> None:
    """Run ``operation`` on each selected job in Redis and report each outcome."""
    rows = list(queryset.order_by("queue", "job_id")[:MAX_ACTION_JOBS + 1])
    if len(rows) > MAX_ACTION_JOBS:
        model_admin.message_user(
            request, f"Select at most {MAX_ACTION_JOBS} jobs per action.", messages.ERROR)
        return
    by = f"{request.user.get_username()} (admin)"
    done: dict[str, list[str]] = {}
    changed: dict[str, list[str]] = {}  # queue -> ids of the jobs changed
    refused: list[str] = []
    for row in rows:
        try:
            job = EngineJob.fetch(row.job_id, row.queue)
            what = operation(job, by)
        except JobNotFound:
            refused.append(f"{row.job_id}: not in Redis any more")
            continue
        except InvalidJobState as exc:
            refused.append(f"{row.job_id}: is {exc.reason}")
            continue
        except DelayQConnectionError:
            model_admin.message_user(request, REDIS_DOWN, messages.ERROR)
            break
        except (CommandRefused, ValueError) as exc:  # an ACL refusal; a damaged row's id
            refused.append(f"{row.job_id[:80]}: {str(exc)[:200]}")
            continue
        done.setdefault(what, []).append(row.job_id)
        changed.setdefault(row.queue, []).append(row.job_id)
    for queue, job_ids in changed.items():
        try:
            refresh_rows(queue, job_ids)  # the list shows the change before the events
        except DelayQConnectionError:
            break  # the events bring the rows up to date later
    for what, ids in done.items():
        model_admin.message_user(request, f"{len(ids)} job(s) {what}: {', '.join(ids)}",
                                 messages.SUCCESS)
    if refused:
        model_admin.message_user(
            request, f"{len(refused)} job(s) not {verb}: {'; '.join(refused)}",
            messages.WARNING)
    log(logger, logging.INFO, "admin action", action=verb, user=request.user.get_username(),
        jobs=len(rows), changed=sum(len(v) for v in done.values()))


