"""The Django admin: the mirrored job list and job page, and their actions.

Rows are the mirror's copy (history and search); every action goes through the engine's
:class:`~django_delayq.engine.job.Job` on Redis, the source of truth, and the job page
shows the live Redis state next to the mirrored one. Acting needs the
``django_delayq.change_job`` permission; viewing needs ``view_job``.
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.urls import URLPattern, path, reverse
from django.utils.functional import lazy
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..engine import DelayQConnectionError, JobNotFound
from ..engine import Job as EngineJob
from ..models import Job
from ..workflows.view import workflow
from . import dashboard, live
from .actions import (
    JOB_OPERATIONS,
    ReadOnlyPages,
    abort,
    act,
    cancel,
    operations_for,
    retry,
    run_now,
)
from .display import (
    attempts_table,
    job_label,
    pre,
    pretty_json,
    progress_bar,
    seconds,
    short_json,
    status_badge,
    when,
    when_short,
    workflow_trees,
    zoned_header,
)

logger = logging.getLogger(__name__)

def has_attempt_log() -> bool:
    """Whether the mirrored model keeps each attempt (``attempt_log``)."""
    return any(f.name == "attempt_log" for f in Job._meta.get_fields())


@admin.register(Job)
class JobAdmin(ReadOnlyPages):
    list_display = ("job_display", "task_display", "queue", "status_display",
                    "attempts_display", "progress_column", "run_at_display", "started_column",
                    "worker_column", "duration_column", "error_column", "args_column")
    list_display_links = ("job_display",)
    list_filter = ("status", "queue", "task_name", "missing_at")
    #: An argument value is found in the arguments' JSON text.
    search_fields = ("=job_id", "task_name", "args", "kwargs")
    date_hierarchy = "run_at"
    ordering = ("-run_at",)
    list_per_page = 50
    show_full_result_count = False
    actions = ("retry_jobs", "cancel_jobs", "run_jobs_now", "abort_jobs")
    fieldsets = (
        (None, {"fields": ("job_id", "queue", "task_name", "status_display", "priority",
                           "attempts_display", "worker", "progress_display")}),
        ("Arguments", {"fields": ("args_display", "kwargs_display")}),
        ("Outcome", {"fields": ("result_display", "error", "aborted_by_display",
                                "traceback_display")}),
        ("Timings", {"fields": ("enqueued_at_display", "run_at_full", "started_at_display",
                                "finished_at_full", "duration_display", "lateness_display")}),
        ("Attempts", {"fields": ("attempts_log_display",)}),
        ("Live state in Redis", {"fields": ("live_state",)}),
        ("Workflow", {"fields": ("workflow_display",)}),
        ("Mirror", {"classes": ("collapse",), "fields": ("last_event_id", "updated_at")}),
    )

    # -- read-only ------------------------------------------------------------------

    def get_readonly_fields(self, request: HttpRequest, obj: Job | None = None) -> list[str]:
        return [f for _, opts in self.fieldsets for f in opts["fields"]]

    def get_list_filter(self, request: HttpRequest) -> tuple[str, ...]:
        return ("status", "queue", "task_name")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Job | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Job, form: Any, change: bool) -> None:
        """The job page is read-only: nothing is saved."""

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The mirrored jobs, under the dashboard's warnings (with no worker or no
        mirror alive, the list stays behind Redis and would not say why)."""
        try:
            warnings = dashboard.health_warnings()
        except dashboard.READ_ERRORS as exc:  # never a 500 for a warning
            warnings = [dashboard.unavailable(exc)]
        return super().changelist_view(request, {"title": "Jobs", "dq_warnings": warnings,
                                                 "dq_poll_ms": live.POLL_MS,
                                                 **(extra_context or {})})

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        row = self.get_object(request, object_id)
        operations: list[str] = []
        status = "" if row is None else _live_status(row)
        if row is not None and self.has_change_permission(request):
            operations = operations_for(status)
        extra_context = {**(extra_context or {}), "title": "Job", "show_save": False,
                         "dq_poll_ms": live.POLL_MS, "dq_live_status": status,
                         "job_operations": operations,
                         "show_save_and_continue": False, "show_save_and_add_another": False,
                         "show_delete": False}
        return super().change_view(request, object_id, form_url, extra_context)

    # -- columns and fields -----------------------------------------------------------

    @admin.display(description="status", ordering="status")
    def status_display(self, obj: Job) -> SafeString:
        return status_badge(obj.status, missing_at=obj.missing_at)

    @admin.display(description="job", ordering="job_id")
    def job_display(self, obj: Job) -> SafeString:
        return job_label(obj.job_id, obj.task_name)

    @admin.display(description="task", ordering="task_name")
    def task_display(self, obj: Job) -> SafeString:
        module, _, name = obj.task_name.rpartition(".")
        return format_html('<span title="{}">{}</span>', obj.task_name,
                           name if module else obj.task_name)

    @admin.display(description=lazy(zoned_header, str)("run at"), ordering="run_at")
    def run_at_display(self, obj: Job) -> str:
        return when_short(obj.run_at)

    @admin.display(description="duration")
    def duration_column(self, obj: Job) -> str:
        return seconds(obj.duration)

    @admin.display(description="progress")
    def progress_column(self, obj: Job) -> SafeString | str:
        return live.progress_cell(obj)

    @admin.display(description=lazy(zoned_header, str)("started"), ordering="started_at")
    def started_column(self, obj: Job) -> SafeString | str:
        return live.started_cell(obj)

    @admin.display(description="worker", ordering="worker")
    def worker_column(self, obj: Job) -> SafeString | str:
        return live.worker_cell(obj)

    @admin.display(description="error")
    def error_column(self, obj: Job) -> SafeString | str:
        if not obj.error:
            return "-"
        kind, sep, message = obj.error.partition(": ")  # "module.Class: message"
        return format_html('<span class="dq-cut" title="{}">{}{}{}</span>', obj.error,
                           kind.rsplit(".", 1)[-1], sep, message)

    @admin.display(description="arguments")
    def args_column(self, obj: Job) -> SafeString:
        full = short_json({"args": obj.args, "kwargs": obj.kwargs}, 2000)
        shown = short_json(obj.args, 40) + (
            " " + short_json(obj.kwargs, 30) if obj.kwargs else "")
        return format_html('<code class="dq-cut" title="{}">{}</code>', full, shown)

    @admin.display(description="enqueued at")
    def enqueued_at_display(self, obj: Job) -> str:
        return when(obj.enqueued_at)

    @admin.display(description="run at")
    def run_at_full(self, obj: Job) -> str:
        return when(obj.run_at)

    @admin.display(description="started at")
    def started_at_display(self, obj: Job) -> str:
        return when(obj.started_at)

    @admin.display(description="finished at")
    def finished_at_full(self, obj: Job) -> str:
        return when(obj.finished_at)

    @admin.display(description="each attempt")
    def attempts_log_display(self, obj: Job) -> SafeString | str:
        if has_attempt_log():
            return attempts_table(getattr(obj, "attempt_log", None))
        return (f"{obj.attempts} attempt(s) of {obj.max_attempts}; this version keeps the "
                "latest attempt's worker, times and error (above).")

    @admin.display(description="attempts", ordering="attempts")
    def attempts_display(self, obj: Job) -> str:
        return f"{obj.attempts}/{obj.max_attempts}"

    @admin.display(description="progress")
    def progress_display(self, obj: Job) -> SafeString | str:
        return progress_bar(obj.progress, obj.progress_message)

    @admin.display(description="args")
    def args_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.args)

    @admin.display(description="kwargs")
    def kwargs_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.kwargs)

    @admin.display(description="result")
    def result_display(self, obj: Job) -> SafeString:
        return pretty_json(obj.result)

    @admin.display(description="aborted by")
    def aborted_by_display(self, obj: Job) -> str:
        return obj.aborted_by or "-"

    @admin.display(description="traceback")
    def traceback_display(self, obj: Job) -> SafeString:
        return pre(obj.traceback)

    @admin.display(description="duration")
    def duration_display(self, obj: Job) -> str:
        return "-" if obj.duration is None else f"{obj.duration:.3f} s"

    @admin.display(description="start lateness")
    def lateness_display(self, obj: Job) -> str:
        return "-" if obj.lateness is None else f"{obj.lateness:.3f} s"

    @admin.display(description="parents and dependants")
    def workflow_display(self, obj: Job) -> SafeString | str:
        """The jobs it waits for and those that wait for it, each with its live status,
        as two trees of a few levels."""
        try:
            live: EngineJob | None = EngineJob.fetch(obj.job_id, obj.queue)
        except JobNotFound:
            live = None
        except DelayQConnectionError:
            return "Redis is unreachable: workflow unavailable."
        except ValueError as exc:  # an id or queue name Redis cannot hold
            return f"Workflow unavailable: {exc}"
        flow = workflow(obj.queue, obj.job_id, live, obj)
        if not flow["parents"] and not flow["children"]:
            return "-"
        return workflow_trees(flow, _row_pks(flow))

    @admin.display(description="Redis now")
    def live_state(self, obj: Job) -> SafeString:
        try:
            live = EngineJob.fetch(obj.job_id, obj.queue)
            position = live.position()
        except JobNotFound:
            return format_html("<p>{}</p>", "Not in Redis any more (expired after its result "
                                            "TTL, or purged). The mirrored copy is all there is.")
        except DelayQConnectionError:
            return format_html("<p>{}</p>", "Redis is unreachable: live state unavailable.")
        except ValueError as exc:  # an id or queue name Redis cannot hold
            return format_html("<p>Live state unavailable: {}</p>", str(exc))
        rows = [
            ("status", status_badge(obj.status), status_badge(live.status)),
            ("attempts", f"{obj.attempts}/{obj.max_attempts}",
             f"{live.attempts}/{live.max_attempts}"),
            ("run at", when(obj.run_at), when(live.run_at)),
            ("started at", when(obj.started_at), when(live.started_at)),
            ("finished at", when(obj.finished_at), when(live.finished_at)),
            ("worker", obj.worker or "-", live.worker or "-"),
            ("error", obj.error or "-", live.error or "-"),
            ("aborted by", obj.aborted_by or "-", live.aborted_by or "-"),
            ("progress", progress_bar(obj.progress, obj.progress_message),
             progress_bar(live.progress, live.progress_message)),
            ("position in queue", "", "-" if position is None else position),
        ]
        if live.concurrency_key is not None:
            rows.append(("concurrency key", "", live.concurrency_key + (
                " (waiting for a slot: the key is at its limit)" if live.waiting_for_slot
                else "")))
        if live.damaged:
            rows.append(("damaged in Redis", "", "; ".join(
                f"{name}: {found!r}" for name, found in sorted(live.damaged.items()))))
        body = format_html_join("", "<tr><th>{}</th><td>{}</td><td>{}</td></tr>", rows)
        return format_html('<table class="dq-live"><thead><tr><th></th><th>mirrored</th>'
                           "<th>live in Redis</th></tr></thead><tbody>{}</tbody></table>", body)

    # -- actions ------------------------------------------------------------------------

    @admin.action(description="Retry selected failed or cancelled jobs", permissions=["change"])
    def retry_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        act(self, request, queryset, "retried", retry)

    @admin.action(description="Cancel selected jobs that have not started",
                  permissions=["change"])
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        act(self, request, queryset, "cancelled", cancel)

    @admin.action(description="Run selected jobs now", permissions=["change"])
    def run_jobs_now(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        act(self, request, queryset, "run now", run_now)

    @admin.action(description="Abort selected jobs (running ones are stopped)",
                  permissions=["change"])
    def abort_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        act(self, request, queryset, "aborted", abort)

    # -- the queues dashboard ----------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        view = self.admin_site.admin_view
        own = [
            path("queues/", view(dashboard.QueuesView.as_view(model_admin=self)),
                 name="django_delayq_queues"),
            path("queues/data/", view(dashboard.QueuesDataView.as_view(model_admin=self)),
                 name="django_delayq_queues_data"),
            path("queues/<str:queue>/<str:operation>/",
                 view(dashboard.QueueControlView.as_view(model_admin=self)),
                 name="django_delayq_queue_control"),
            path("live/", view(lambda request: live.live_rows(request, self)),
                 name="django_delayq_job_live"),
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
        act(self, request, Job.objects.filter(pk=row.pk), verb, function)
        return HttpResponseRedirect(reverse("admin:django_delayq_job_change", args=[row.pk]))


def _row_pks(flow: dict[str, Any]) -> dict[tuple[str, str], int]:
    """The mirrored row of each job of a workflow tree (one query), by (queue, id)."""
    refs: set[tuple[str, str]] = set()

    def walk(nodes: list[dict[str, Any]], direction: str) -> None:
        for node in nodes:
            refs.add((node["queue"], node["job_id"]))
            walk(node.get(direction, []), direction)

    walk(flow["parents"], "parents")
    walk(flow["children"], "children")
    rows = Job.objects.filter(job_id__in={i for _, i in refs}).values_list("queue", "job_id",
                                                                           "pk")
    return {(q, i): pk for q, i, pk in rows if (q, i) in refs}


def _live_status(row: Job) -> str:
    """The job's status in Redis now ("" once it left Redis: nothing can be done to it);
    the mirrored one when Redis cannot tell."""
    try:
        return EngineJob.fetch(row.job_id, row.queue).status
    except JobNotFound:
        return ""
    except (DelayQConnectionError, ValueError):
        return row.status
