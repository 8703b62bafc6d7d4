"""The admin's queues dashboard: live counts, pause/resume/purge, throughput, workers.

Everything here is read live from Redis (never from the mirror). Views are wrapped by
``admin_site.admin_view`` (staff login, CSRF); viewing needs the ``view_job`` or
``change_job`` permission, the buttons need ``change_job``.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.safestring import SafeString
from django.views import View

from ..connection import get_broker
from ..engine import Broker, DelayQConnectionError, DelayQError, Queue
from ..engine.backlog import Backlog, backlogs
from ..engine.errors import CommandRefused
from ..engine.jobhash import from_ms
from ..engine.keys import validate_queue_name
from ..engine.stats import QueueStats, queue_stats
from ..engine.status import PURGEABLE, STATUSES
from ..engine.workers import any_alive, live_workers
from ..mirror.consumer import GROUP
from ..models import Job, QueuesDashboard
from ..task import registry
from .charts import lateness_chart, quantile, throughput_chart
from .display import when

logger = logging.getLogger(__name__)

REDIS_DOWN = "Redis is unreachable, so live queue state cannot be shown. Try again shortly."
#: What reading the live state may raise: Redis unreachable or refusing
#: (:class:`CommandRefused`), a name Redis holds that no queue can have.
READ_ERRORS = (DelayQError, ValueError)
OPERATIONS = ("pause", "resume", "purge")
#: A mirror whose consumer has not read for longer than this (ms) counts as stopped.
MIRROR_IDLE_MS = 60_000


@dataclass
class QueueState:
    name: str
    counts: dict[str, int]
    paused: bool
    next_due: dt.datetime | None
    completed_last_hour: int
    failed_last_hour: int
    chart: SafeString
    lateness_chart: SafeString
    lateness_p50: str = "-"
    lateness_p95: str = "-"
    #: Events the model mirror skipped as unusable: how many, and the newest reasons.
    skipped: int = 0
    skipped_reasons: list[str] = field(default_factory=list)
    purgeable: int = field(init=False)

    def __post_init__(self) -> None:
        self.purgeable = sum(self.counts[s] for s in PURGEABLE)

    @property
    def count_list(self) -> list[tuple[str, int]]:
        return [(s, self.counts[s]) for s in STATUSES]

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "counts": self.counts, "paused": self.paused,
                "next_due": when(self.next_due) if self.next_due else "-",
                "completed_last_hour": self.completed_last_hour,
                "failed_last_hour": self.failed_last_hour, "chart": str(self.chart),
                "lateness_chart": str(self.lateness_chart),
                "lateness_p50": self.lateness_p50, "lateness_p95": self.lateness_p95,
                "skipped": self.skipped, "skipped_reasons": self.skipped_reasons}


def queue_state(queue: Queue, stats: QueueStats | None = None) -> QueueState:
    summary = queue.summary()
    skipped, reasons = queue.skipped_events()
    stats = stats or queue_stats(queue.broker, [queue.name])[queue.name]
    return QueueState(
        name=summary.name, counts=summary.counts, paused=summary.paused,
        next_due=summary.next_due, completed_last_hour=summary.completed_recently,
        failed_last_hour=summary.failed_recently, chart=throughput_chart(summary.throughput),
        lateness_chart=lateness_chart(stats.lateness),
        lateness_p50=quantile(stats.lateness, 0.5), lateness_p95=quantile(stats.lateness, 0.95),
        skipped=skipped, skipped_reasons=reasons)


@dataclass
class MirrorState:
    """Whether a mirror reads the queues' events, and how many wait for it."""

    lag: int = 0
    alive: bool = False
    #: Whether ``lag`` is a lower bound (a shard's backlog went past the count's cap).
    capped: bool = False

    @property
    def described(self) -> str:
        """The lag in words: ``"12 event(s)"``, ``"at least 1000 event(s)"``."""
        return f"{'at least ' if self.capped else ''}{self.lag} event(s)"


def mirror_state(broker: Broker, names: list[str]) -> MirrorState:
    """What the mirror still has to apply of the queues ``names`` (its consumer group's
    backlog), and whether one of its consumers read within :data:`MIRROR_IDLE_MS`.
    Raises the engine's errors, a refusal (an ACL without ``XINFO``) included."""
    total = Backlog()
    for backlog in backlogs(broker, names, GROUP, idle=True).values():
        total.add(backlog)
    alive = total.idle_ms is not None and total.idle_ms < MIRROR_IDLE_MS
    return MirrorState(total.events, alive, total.capped)


def periodic_schedules(broker: Broker) -> list[dict[str, Any]]:
    """Each periodic task: its schedule, next occurrence, and last run the mirror saw."""
    tasks = [t for t in registry.tasks() if t.schedule is not None]
    if not tasks:
        return []
    with broker.read_errors():
        now_ms = broker.server_time_ms()
    rows = []
    for task in tasks:
        assert task.schedule is not None
        last = (Job.objects.filter(task_name=task.name, job_id__startswith="cron:",
                                   started_at__isnull=False)
                .order_by("-started_at").only("job_id", "status", "started_at", "queue")
                .first())
        rows.append({"task": task.name, "queue": task.queue_name,
                     "schedule": task.schedule.describe(),
                     "next": when(from_ms(task.schedule.next_after(now_ms))),
                     "last": when(last.started_at) if last else "never",
                     "last_status": last.status if last else "",
                     "last_pk": last.pk if last else None})
    return rows


def warnings_for(workers_alive: bool, mirror: MirrorState) -> list[str]:
    """What an operator must know first: nothing runs the jobs, or nothing brings them
    into the job list."""
    warnings = []
    if not workers_alive:
        warnings.append("No worker is running: jobs wait until one starts "
                        "(manage.py runworker).")
    if mirror.lag and not mirror.alive:
        warnings.append(f"No mirror is running: {mirror.described} are not in the job "
                        "list yet. The mirror runs inside runworker (or manage.py "
                        "delayq_mirror).")
    return warnings


def health_warnings() -> list[str]:
    """The dashboard's warnings, for the job list: three round trips (four while the
    mirror is behind), whatever the number of queues and workers (raises the engine's
    errors: see :func:`unavailable`)."""
    broker = get_broker()
    return warnings_for(any_alive(broker),
                        mirror_state(broker, [q.name for q in Queue.all(broker=broker)]))


def unavailable(exc: Exception) -> str:
    """What a page shows, and logs, instead of the live state when reading it failed:
    Redis unreachable, or refusing a read (an ACL without a command the page needs)."""
    if isinstance(exc, DelayQConnectionError):
        logger.warning("admin: Redis unreachable error=%s", exc)
        return REDIS_DOWN
    logger.warning("admin: live queue state unavailable error=%s: %s",
                   type(exc).__name__, exc)
    if isinstance(exc, ValueError):  # a name in Redis that no queue can have
        return f"Live queue state is unavailable: {str(exc)[:200]}"
    # CommandRefused names redis-py's error first
    refusal = str(exc) if isinstance(exc, CommandRefused) else f"{type(exc).__name__}: {exc}"
    return f"Live queue state is unavailable: Redis refused a read ({refusal[:200]})."


def snapshot() -> dict[str, Any]:
    """Everything the dashboard shows, read live (raises the engine's errors)."""
    broker = get_broker()
    queues = Queue.all(broker=broker)
    names = [q.name for q in queues]
    stats = queue_stats(broker, names)
    workers = live_workers(broker)
    mirror = mirror_state(broker, names)
    return {"queues": [queue_state(q, stats[q.name]) for q in queues], "workers": workers,
            "mirror": mirror, "warnings": warnings_for(bool(workers), mirror),
            "periodic": periodic_schedules(broker)}


class _AdminView(View):
    model_admin: admin.ModelAdmin[Any] | None = None  # the JobAdmin (jobs.py) serving it

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
    """Every queue's live state, the workers alive, periodic schedules, and warnings."""

    def get(self, request: HttpRequest) -> HttpResponse:
        self.require(request, change=False)
        error = ""
        data: dict[str, Any] = {"queues": [], "workers": [], "warnings": [], "periodic": []}
        try:
            data = snapshot()
        except READ_ERRORS as exc:
            error = unavailable(exc)
        return TemplateResponse(request, "admin/django_delayq/queues.html", self.context(
            request, title="Queues", error=error, statuses=STATUSES, **data))


class QueuesDataView(_AdminView):
    """The dashboard's figures as JSON, for its script to refresh the page."""

    def get(self, request: HttpRequest) -> HttpResponse:
        self.require(request, change=False)
        try:
            data = snapshot()
        except READ_ERRORS as exc:
            return JsonResponse({"error": unavailable(exc)}, status=503)
        workers = [{"name": w.name, "host": w.host, "pid": w.pid,
                    "role": ("supervisor" if w.role == "supervisor" else
                             f"child of {w.supervisor}" if w.supervisor else "worker"),
                    "queues": ", ".join(w.queues), "concurrency": w.concurrency,
                    "busy": w.busy, "processed": w.processed, "failed": w.failed,
                    "heartbeat": when(w.heartbeat), "started": when(w.started),
                    "ago": round(w.seconds_ago, 1)} for w in data["workers"]]
        return JsonResponse({"queues": [q.as_json() for q in data["queues"]],
                             "workers": workers, "warnings": data["warnings"],
                             "mirror_lag": data["mirror"].lag,
                             "mirror_lag_capped": data["mirror"].capped})


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


@admin.register(QueuesDashboard)
class QueuesDashboardAdmin(admin.ModelAdmin):
    """The admin index's "Queues dashboard" entry: its list is the dashboard. Seen by
    whoever may view jobs."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.has_perm("django_delayq.view_job") or request.user.has_perm(
            "django_delayq.change_job")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self.has_view_permission(request)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        return HttpResponseRedirect(reverse("admin:django_delayq_queues"))
