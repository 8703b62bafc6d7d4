"""The admin's queues dashboard: live counts, pause/resume/purge, throughput, workers.

Everything here is read live from Redis (never from the mirror). Views are wrapped by
``admin_site.admin_view`` (staff login, CSRF); viewing needs the ``view_job`` or
``change_job`` permission, the buttons need ``change_job``.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.views import View

from .connection import get_broker
from .engine import DelayQConnectionError, Queue
from .engine.job import from_ms
from .engine.keys import STATUSES, validate_queue_name
from .engine.queue import PURGEABLE

if TYPE_CHECKING:
    from .admin import JobAdmin

logger = logging.getLogger(__name__)

CHART_WIDTH, CHART_HEIGHT = 180, 40
REDIS_DOWN = "Redis is unreachable, so live queue state cannot be shown. Try again shortly."
OPERATIONS = ("pause", "resume", "purge")


@dataclass
class QueueState:
    name: str
    counts: dict[str, int]
    paused: bool
    next_due: dt.datetime | None
    completed_last_hour: int
    failed_last_hour: int
    chart: SafeString
    purgeable: int = field(init=False)

    def __post_init__(self) -> None:
        self.purgeable = sum(self.counts[s] for s in PURGEABLE)

    @property
    def count_list(self) -> list[tuple[str, int]]:
        return [(s, self.counts[s]) for s in STATUSES]


def throughput_chart(points: list[tuple[dt.datetime, int, int]]) -> SafeString:
    """An inline SVG bar chart: completed (green) under failed (red) per minute."""
    top = max((c + f for _, c, f in points), default=0) or 1
    width = CHART_WIDTH / max(len(points), 1)
    bars = []
    for i, (minute, completed, failed) in enumerate(points):
        h_ok = CHART_HEIGHT * completed / top
        h_bad = CHART_HEIGHT * failed / top
        x = f"{i * width:.1f}"
        bars.append((
            f"{minute:%H:%M} UTC: {completed} completed, {failed} failed",
            x, f"{CHART_HEIGHT - h_ok:.1f}", f"{max(width - 1, 1):.1f}", f"{h_ok:.1f}",
            x, f"{CHART_HEIGHT - h_ok - h_bad:.1f}", f"{max(width - 1, 1):.1f}", f"{h_bad:.1f}",
        ))
    body = format_html_join(
        "", '<g><title>{}</title><rect class="dq-ok" x="{}" y="{}" width="{}" height="{}" '
        'fill="#2e7d32"/><rect class="dq-fail" x="{}" y="{}" width="{}" height="{}" '
        'fill="#c62828"/></g>', bars)
    return format_html(
        '<svg class="dq-chart" role="img" aria-label="jobs finished per minute, last hour" '
        'width="{}" height="{}" viewBox="0 0 {} {}" xmlns="http://www.w3.org/2000/svg">'
        '<rect width="100%" height="100%" fill="#f4f4f4"/>{}</svg>',
        CHART_WIDTH, CHART_HEIGHT, CHART_WIDTH, CHART_HEIGHT, body)


def queue_state(queue: Queue) -> QueueState:
    points = queue.throughput(60)
    return QueueState(
        name=queue.name, counts=queue.counts(), paused=queue.is_paused,
        next_due=queue.next_due(), completed_last_hour=sum(c for _, c, _ in points),
        failed_last_hour=sum(f for _, _, f in points), chart=throughput_chart(points))


def workers_alive() -> list[dict[str, Any]]:
    """Live workers (newest heartbeat first), from the workers ZSET and their hashes."""
    broker = get_broker()
    keys = broker.global_keys
    with broker.connection_errors():
        now_ms = broker.server_time_ms()
        entries = broker.client.zrevrange(keys.workers, 0, 199, withscores=True)
        pipe = broker.client.pipeline(transaction=False)
        for name, _ in entries:
            pipe.hgetall(keys.worker(name))
        infos = pipe.execute()
    workers = []
    for (name, beat), info in zip(entries, infos, strict=True):
        if not info:
            continue  # its hash expired: the worker is gone
        workers.append({
            "name": name, "host": info.get("host", ""), "pid": info.get("pid", ""),
            "queues": info.get("queues", "").replace(",", ", "),
            "concurrency": info.get("concurrency", ""), "busy": info.get("busy", ""),
            "processed": info.get("processed", ""), "failed": info.get("failed", ""),
            "heartbeat": from_ms(int(beat)), "ago": max(0.0, (now_ms - beat) / 1000),
            "started": from_ms(info.get("started")),
        })
    return workers


class _AdminView(View):
    model_admin: JobAdmin | None = None

    def context(self, request: HttpRequest, **extra: Any) -> dict[str, Any]:
        assert self.model_admin is not None
        opts = self.model_admin.model._meta
        return {**self.model_admin.admin_site.each_context(request), "opts": opts,
                "app_label": opts.app_label,
                "can_change": self.model_admin.has_change_permission(request), **extra}

    def require(self, request: HttpRequest, *, change: bool) -> None:
        assert self.model_admin is not None
        allowed = (self.model_admin.has_change_permission(request) if change
                   else self.model_admin.has_view_or_change_permission(request))
        if not allowed:
            raise PermissionDenied


class QueuesView(_AdminView):
    """Every queue's live state, and the workers alive."""

    def get(self, request: HttpRequest) -> HttpResponse:
        self.require(request, change=False)
        error = ""
        queues: list[QueueState] = []
        workers: list[dict[str, Any]] = []
        try:
            queues = [queue_state(q) for q in Queue.all()]
            workers = workers_alive()
        except DelayQConnectionError as exc:
            logger.warning("queues dashboard: Redis unreachable error=%s", exc)
            error = REDIS_DOWN
        return TemplateResponse(request, "admin/django_delayq/queues.html", self.context(
            request, title="Queues", queues=queues, workers=workers, error=error,
            statuses=STATUSES))


class QueueControlView(_AdminView):
    """POST pause, resume or purge one queue; GET purge asks for confirmation."""

    def _queue(self, name: str) -> Queue:
        try:
            validate_queue_name(name)
            known = {q.name for q in Queue.all()}
        except ValueError:
            raise Http404("no such queue") from None
        if name not in known:
            raise Http404("no such queue")
        return Queue(name)

    def _back(self) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:django_delayq_queues"))

    def get(self, request: HttpRequest, queue: str, operation: str) -> HttpResponse:
        self.require(request, change=True)
        if operation != "purge":
            return HttpResponse("use POST", status=405, headers={"Allow": "POST"})
        try:
            state = queue_state(self._queue(queue))
        except DelayQConnectionError:
            messages.error(request, REDIS_DOWN)
            return self._back()
        return TemplateResponse(request, "admin/django_delayq/purge_confirm.html", self.context(
            request, title=f"Purge queue {queue}?", queue=state, purgeable=PURGEABLE))

    def post(self, request: HttpRequest, queue: str, operation: str) -> HttpResponse:
        self.require(request, change=True)
        if operation not in OPERATIONS:
            raise Http404("unknown operation")
        try:
            target = self._queue(queue)
            if operation == "pause":
                target.pause()
                messages.success(request, f"Queue {queue} paused: workers stop claiming its "
                                          "jobs (enqueuing still works).")
            elif operation == "resume":
                target.resume()
                messages.success(request, f"Queue {queue} resumed.")
            elif request.POST.get("confirm") != "yes":
                return HttpResponseRedirect(
                    reverse("admin:django_delayq_queue_control", args=[queue, "purge"]))
            else:
                removed = target.purge()
                messages.success(request, f"Queue {queue} purged: {removed} job(s) deleted "
                                          "(running jobs were left alone).")
        except DelayQConnectionError:
            messages.error(request, REDIS_DOWN)
            return self._back()
        logger.info("admin queue operation=%s queue=%s user=%s", operation, queue,
                    request.user.pk)
        return self._back()
