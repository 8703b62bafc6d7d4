"""What makes the job list and the job page live: the cells that change while a job
runs, rendered the same way for the first page and for the small JSON view their script
polls (``jobs/live/?pk=...``), so a refreshed cell reads as a loaded one.

The rows are the mirror's (what the list shows); the job page adds the job's status in
Redis, which its script compares with the one it was loaded with, reloading the page
when the job moved on.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, JsonResponse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..engine import DelayQConnectionError, JobNotFound
from ..engine import Job as EngineJob
from ..models import Job
from .display import progress_bar, seconds, status_badge, when_short

#: Rows one poll may ask for (a list page shows at most 100 by default).
MAX_ROWS = 200
#: Milliseconds between two polls of a page's script.
POLL_MS = 3000


def worker_cell(row: Job) -> SafeString | str:
    if not row.worker:
        return "-"
    return format_html('<span class="dq-cut" title="{}">{}</span>', row.worker, row.worker)


def started_cell(row: Job) -> SafeString | str:
    """The start of the last attempt: its time of day (the date in the tooltip)."""
    if row.started_at is None:
        return "-"
    full = when_short(row.started_at)
    return format_html('<span title="{}">{}</span>', full, full.split(" ")[-1])


def progress_cell(row: Job) -> SafeString | str:
    if row.progress is None:
        return "-"
    return format_html('<span title="{}">{}</span>', row.progress_message,
                       progress_bar(row.progress, ""))


def cells(row: Job) -> dict[str, str]:
    """The cells of a job list row that change while its job runs, by column name."""
    return {
        "status_display": status_badge(row.status),
        "attempts_display": f"{row.attempts}/{row.max_attempts}",
        "progress_column": progress_cell(row),
        "worker_column": worker_cell(row),
        "started_column": started_cell(row),
        "duration_column": seconds(row.duration),
    }


def live_rows(request: HttpRequest, model_admin: Any) -> JsonResponse:
    """The changing cells of the rows ``?pk=1&pk=2...`` (at most :data:`MAX_ROWS`), and
    with ``?live=1`` each one's status in Redis ("" once it left Redis)."""
    if not model_admin.has_view_or_change_permission(request):
        raise PermissionDenied
    pks = [int(pk) for pk in request.GET.getlist("pk")[:MAX_ROWS]
           if pk.isdecimal() and len(pk) <= 18]  # a row id the database can hold
    rows = {row.pk: row for row in Job.objects.filter(pk__in=pks)}
    data: dict[str, Any] = {}
    for pk, row in rows.items():
        entry: dict[str, Any] = {"status": row.status, "cells": cells(row),
                                 "aborted_by": row.aborted_by}
        if request.GET.get("live"):
            try:
                live = EngineJob.fetch(row.job_id, row.queue)
                entry["live"] = {"status": live.status, "attempts": live.attempts,
                                 "progress": progress_bar(live.progress,
                                                          live.progress_message),
                                 "aborted_by": live.aborted_by}
            except JobNotFound:
                entry["live"] = {"status": ""}
            except (DelayQConnectionError, ValueError):
                entry["live"] = None
        data[str(pk)] = entry
    return JsonResponse({"rows": data})
