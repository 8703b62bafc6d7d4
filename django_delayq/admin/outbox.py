"""The admin page of the outbox: jobs written in a transaction and not yet in Redis.

Rows normally live for milliseconds (the commit hook sends them); the page matters when
Redis was unreachable, or when Redis refused a row: a parked row shows its error, and
"retry now" sends it again (parking it again if Redis still refuses). Rows are never
edited here; viewing needs ``view_outboxentry``, retrying ``change_outboxentry``,
deleting ``delete_outboxentry``.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.functional import lazy
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..connection import get_broker
from ..engine import keyed
from ..models import OutboxEntry
from ..outbox.send import send_rows, settle
from ..task import registry
from .actions import MAX_ACTION_JOBS, ReadOnlyPages
from .display import pre, pretty_json, when_short, zoned_header


class ParkedFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("parked", "Parked (refused)"), ("waiting", "Waiting")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if self.value() == "parked":
            return queryset.filter(parked_at__isnull=False)
        if self.value() == "waiting":
            return queryset.filter(parked_at__isnull=True)
        return queryset


@admin.register(OutboxEntry)
class OutboxEntryAdmin(ReadOnlyPages):
    list_display = ("job_id", "task_name", "queue", "state", "attempts", "run_at_column",
                    "created_at_column", "short_error")
    list_filter = (ParkedFilter, "queue", "task_name")
    search_fields = ("=job_id", "task_name")
    ordering = ("id",)
    list_per_page = 50
    show_full_result_count = False
    actions = ("retry_now", "delete_selected")
    fields = ("job_id", "queue", "task_name", "state", "priority", "run_at", "max_attempts",
              "keys_display", "args_display", "kwargs_display", "created_at", "attempts",
              "parked_at", "error_display")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        return super().changelist_view(request, {"title": "Jobs waiting in the outbox",
                                                 **(extra_context or {})})

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # The change permission allows "retry now"; the page itself stays read-only.
        return obj is None and super().has_change_permission(request, obj)

    @admin.display(description="state")
    def state(self, row: OutboxEntry) -> SafeString:
        if row.parked_at is not None:
            return format_html('<strong style="color:#c62828">{}</strong>', "parked")
        return format_html("{}", "waiting")

    @admin.display(description=lazy(zoned_header, str)("run at"), ordering="run_at")
    def run_at_column(self, row: OutboxEntry) -> str:
        return when_short(row.run_at) if row.run_at else "as soon as sent"

    @admin.display(description=lazy(zoned_header, str)("written at"), ordering="created_at")
    def created_at_column(self, row: OutboxEntry) -> str:
        return when_short(row.created_at)

    @admin.display(description="error")
    def short_error(self, row: OutboxEntry) -> SafeString | str:
        """The error cut to the column (the whole one in the tooltip and on the page)."""
        if not row.error:
            return "-"
        return format_html('<span class="dq-cut" title="{}">{}</span>', row.error[:2000],
                           row.error[:300])

    @admin.display(description="error")
    def error_display(self, row: OutboxEntry) -> SafeString:
        return pre(row.error)

    @admin.display(description="arguments")
    def args_display(self, row: OutboxEntry) -> SafeString:
        return _json_block(row.args)

    @admin.display(description="keyword arguments")
    def kwargs_display(self, row: OutboxEntry) -> SafeString:
        return _json_block(row.kwargs)

    @admin.display(description="flow-control keys")
    def keys_display(self, row: OutboxEntry) -> str:
        try:
            options = keyed.from_text(row.keyed)
        except (TypeError, ValueError):
            return row.keyed  # damaged: shown as stored (the row's error says why)
        if options is None:
            return "-"
        parts = []
        if options.concurrency_key:
            parts.append(f"concurrency key {options.concurrency_key} "
                         f"(limit {options.concurrency_limit})")
        if options.dedupe_mode:
            parts.append(f"dedupe key {options.dedupe_key} ({options.dedupe_mode}, "
                         f"window {options.window_ms / 1000:g} s)")
        return "; ".join(parts)

    @admin.action(description="Retry now: send the selected rows to Redis",
                  permissions=["change"])
    def retry_now(self, request: HttpRequest, queryset: QuerySet[OutboxEntry]) -> None:
        rows = list(queryset.order_by("pk")[:MAX_ACTION_JOBS])
        using = queryset.db
        OutboxEntry.objects.using(using).filter(pk__in=[r.pk for r in rows]).update(
            parked_at=None, attempts=0, error="")
        outcome = send_rows(get_broker(), rows, registry)
        settle(using, outcome)
        if outcome.sent:
            self.message_user(request, f"{len(outcome.sent)} job(s) sent to Redis.",
                              messages.SUCCESS)
        if outcome.refused:
            self.message_user(request, f"{len(outcome.refused)} row(s) refused again and "
                              "parked: see their error.", messages.ERROR)
        if outcome.failure is not None:
            self.message_user(request, "Redis is unreachable: the rows wait for the relay.",
                              messages.WARNING)


def _json_block(text: str) -> SafeString:
    try:
        return pretty_json(json.loads(text))
    except ValueError:
        return pre(text)
