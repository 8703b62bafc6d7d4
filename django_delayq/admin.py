"""The Django admin: the mirrored job list and job page, actions, and the queues dashboard.

Rows are the mirror's copy (history and search); every action goes through the engine's
:class:`~django_delayq.engine.job.Job` on Redis, the source of truth, and the job page
shows the live Redis state next to the mirrored one. Acting needs the
``django_delayq.change_job`` permission; viewing needs ``view_job``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
from collections.abc import Callable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from . import dashboard
from .engine import DelayQConnectionError, InvalidJobState, JobNotFound
from .engine import Job as EngineJob
from .models import Job, JobStatus

logger = logging.getLogger(__name__)

#: Badge colours per status (background, text).
STATUS_COLOURS = {
    JobStatus.SCHEDULED: ("#5b7fbd", "#fff"),
    JobStatus.READY: ("#2f6fab", "#fff"),
    JobStatus.ACTIVE: ("#c77c02", "#fff"),
    JobStatus.COMPLETED: ("#2e7d32", "#fff"),
    JobStatus.FAILED: ("#c62828", "#fff"),
    JobStatus.CANCELLED: ("#757575", "#fff"),
    JobStatus.PURGED: ("#424242", "#fff"),
}
#: Most jobs one admin action touches (each is one Redis round trip or two).
MAX_ACTION_JOBS = 500
REDIS_DOWN = "Redis is unreachable; nothing was changed. Try again in a moment."


def status_badge(status: str) -> SafeString:
    """A coloured badge for a job status (unknown statuses render grey)."""
    background, colour = STATUS_COLOURS.get(status, ("#9e9e9e", "#fff"))  # type: ignore[call-overload]
    label = JobStatus(status).label if status in JobStatus.values else status
    return format_html(
        '<span class="dq-badge dq-status-{}" style="background:{};color:{};padding:2px 8px;'
        'border-radius:9px;font-size:11px;font-weight:600;white-space:nowrap">{}</span>',
        status, background, colour, label)


def pretty_json(value: Any) -> SafeString:
    """A JSON value in a ``<pre>`` block, escaped."""
    text = json.dumps(value, indent=2, ensure_ascii=False, cls=DjangoJSONEncoder, default=str)
    return format_html('<pre class="dq-pre">{}</pre>', text)


def _run_now(job: EngineJob) -> str:
    if job.status in ("scheduled", "ready"):
        job.reschedule(delay=0)
        return "moved to now"
    if job.status in ("failed", "cancelled"):
        job.retry()
        return "retried"
    raise InvalidJobState(f"job is {job.status}")


def _retry(job: EngineJob) -> str:
    job.retry()
    return "retried"


def _cancel(job: EngineJob) -> str:
    if job.cancel():
        return "cancelled"
    raise InvalidJobState(f"job is {job.status}: only a scheduled or ready job can be cancelled")


#: The buttons of the job page: operation -> (verb, what it does to the engine's Job).
JOB_OPERATIONS: dict[str, tuple[str, Callable[[EngineJob], str]]] = {
    "retry": ("retried", _retry),
    "cancel": ("cancelled", _cancel),
    "run-now": ("run now", _run_now),
}


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("job_id", "task_name", "queue", "status_display", "priority",
                    "attempts_display", "run_at_display", "finished_at_display")
    list_display_links = ("job_id",)
    list_filter = ("status", "queue", "task_name")
    search_fields = ("=job_id", "task_name")
    date_hierarchy = "run_at"
    ordering = ("-run_at",)
    list_per_page = 50
    show_full_result_count = False
    actions = ("retry_jobs", "cancel_jobs", "run_jobs_now")
    fieldsets = (
        (None, {"fields": ("job_id", "queue", "task_name", "status_display", "priority",
                           "attempts_display", "worker")}),
        ("Arguments", {"fields": ("args_display", "kwargs_display")}),
        ("Outcome", {"fields": ("result_display", "error", "traceback_display")}),
        ("Timings", {"fields": ("enqueued_at", "run_at", "started_at", "finished_at",
                                "duration_display", "lateness_display")}),
        ("Live state in Redis", {"fields": ("live_state",)}),
        ("Mirror", {"classes": ("collapse",), "fields": ("last_event_id", "updated_at")}),
    )

    # -- read-only ------------------------------------------------------------------

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> list[str]:
        return [f for _, opts in self.fieldsets for f in opts["fields"]]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Job, form: Any, change: bool) -> None:
        """The job page is read-only: nothing is saved."""

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"title": "Jobs", **(extra_context or {})})

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        extra_context = {**(extra_context or {}), "title": "Job", "show_save": False,
                         "job_operations": list(JOB_OPERATIONS)
                         if self.has_change_permission(request) else [],
                         "show_save_and_continue": False, "show_save_and_add_another": False,
                         "show_delete": False}
        return super().change_view(request, object_id, form_url, extra_context)

    # -- columns and fields -----------------------------------------------------------

    @admin.display(description="status", ordering="status")
    def status_display(self, obj: Job) -> SafeString:
        return status_badge(obj.status)

    @admin.display(description="run at (UTC)", ordering="run_at")
    def run_at_display(self, obj: Job) -> str:
        return _short(obj.run_at)

    @admin.display(description="finished (UTC)", ordering="finished_at")
    def finished_at_display(self, obj: Job) -> str:
        return _short(obj.finished_at)

    @admin.display(description="attempts", ordering="attempts")
    def attempts_display(self, obj: Job) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="args")
    def args_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.args)

    @admin.display(description="kwargs")
    def kwargs_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.kwargs)

    @admin.display(description="result")
    def result_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.result)

    @admin.display(description="traceback")
    def traceback_display(self, obj: Job) -> SafeString | str:
        return format_html('<pre class="dq-pre">{}</pre>', obj.traceback) if obj.traceback else "-"

    @admin.display(description="duration")
    def duration_display(self, obj: Job) -> str:
        return "-" if obj.duration is None else f"{obj.duration:.3f} s"

    @admin.display(description="start lateness")
    def lateness_display(self, obj: Job) -> str:
        return "-" if obj.lateness is None else f"{obj.lateness:.3f} s"

    @admin.display(description="Redis now")
    def live_state(self, obj: Job) -> SafeString:
        try:
            live = EngineJob.fetch(obj.job_id, obj.queue)
            position = live.position()
        except JobNotFound:
            return format_html("<p>{}</p>", "Not in Redis any more (expired after its result "
                                            "TTL, or purged). The mirrored copy is all there is.")
        except (DelayQConnectionError, ValueError):
            return format_html("<p>{}</p>", "Redis is unreachable: live state unavailable.")
        rows = [
            ("status", status_badge(obj.status), status_badge(live.status)),
            ("attempts", f"{obj.attempts}/{obj.max_attempts}",
             f"{live.attempts}/{live.max_attempts}"),
            ("run at", _when(obj.run_at), _when(live.run_at)),
            ("started at", _when(obj.started_at), _when(live.started_at)),
            ("finished at", _when(obj.finished_at), _when(live.finished_at)),
            ("worker", obj.worker or "-", live.worker or "-"),
            ("error", obj.error or "-", live.error or "-"),
            ("position in queue", "", "-" if position is None else position),
        ]
        body = format_html_join("", "<tr><th>{}</th><td>{}</td><td>{}</td></tr>", rows)
        return format_html('<table class="dq-live"><thead><tr><th></th><th>mirrored</th>'
                           "<th>live in Redis</th></tr></thead><tbody>{}</tbody></table>", body)

    # -- actions ------------------------------------------------------------------------

    def _act(self, request: HttpRequest, queryset: QuerySet[Job], verb: str,
             operation: Callable[[EngineJob], str]) -> None:
        """Run ``operation`` on each selected job in Redis and report each outcome."""
        rows = list(queryset.order_by("queue", "job_id")[:MAX_ACTION_JOBS + 1])
        if len(rows) > MAX_ACTION_JOBS:
            self.message_user(request, f"Select at most {MAX_ACTION_JOBS} jobs per action.",
                              messages.ERROR)
            return
        done: dict[str, list[str]] = {}
        refused: list[str] = []
        for row in rows:
            try:
                job = EngineJob.fetch(row.job_id, row.queue)
                what = operation(job)
            except JobNotFound:
                refused.append(f"{row.job_id}: not in Redis any more")
                continue
            except InvalidJobState as exc:
                refused.append(f"{row.job_id}: {_reason(exc)}")
                continue
            except DelayQConnectionError:
                self.message_user(request, REDIS_DOWN, messages.ERROR)
                break
            done.setdefault(what, []).append(row.job_id)
            Job.objects.filter(pk=row.pk).update(status=job.status, run_at=job.run_at or row.run_at)
        for what, ids in done.items():
            self.message_user(request, f"{len(ids)} job(s) {what}: {', '.join(ids)}",
                              messages.SUCCESS)
        if refused:
            self.message_user(request, f"{len(refused)} job(s) not {verb}: {'; '.join(refused)}",
                              messages.WARNING)
        logger.info("admin action=%s user=%s jobs=%d changed=%d", verb, request.user.pk,
                    len(rows), sum(len(v) for v in done.values()))

    @admin.action(description="Retry selected failed or cancelled jobs", permissions=["change"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._act(request, queryset, "retried", _retry)

    @admin.action(description="Cancel selected jobs that have not started",
                  permissions=["change"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._act(request, queryset, "cancelled", _cancel)

    @admin.action(description="Run selected jobs now", permissions=["change"])
    def run_jobs_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._act(request, queryset, "run now", _run_now)

    # -- the queues dashboard ----------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        own = [
            path("queues/", view(dashboard.QueuesView.as_view(model_admin=self)),
                 name="django_delayq_queues"),
            path("queues/<str:queue>/<str:operation>/",
                 view(dashboard.QueueControlView.as_view(model_admin=self)),
                 name="django_delayq_queue_control"),
            path("<path:object_id>/act/<str:operation>/", view(self.job_action_view),
                 name="django_delayq_job_act"),
        ]
        return own + super().get_urls()

    def job_action_view(self, request: HttpRequest, object_id: str,
                        operation: str) -> HttpResponse:
        """POST retry, cancel or run-now for the job of one job page, then go back to it."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_change_permission(request):
            raise PermissionDenied
        if operation not in JOB_OPERATIONS:
            raise Http404("unknown operation")
        row = self.get_object(request, object_id)
        if row is None:
            raise Http404("no such job")
        verb, function = JOB_OPERATIONS[operation]
        self._act(request, Job.objects.filter(pk=row.pk), verb, function)
        return HttpResponseRedirect(reverse("admin:django_delayq_job_change", args=[row.pk]))


def _short(value: dt.datetime | None) -> str:
    return "-" if value is None else f"{value.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S}"


def _when(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    return f"{value.astimezone(dt.UTC):%Y-%m-%d %H:%M:%S.%f}"[:-3] + " UTC"


def _reason(exc: InvalidJobState) -> str:
    """The engine's message without its leading ``job 'ID'`` (already shown)."""
    return re.sub(r"^job '[^']*' ", "", str(exc))
