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
from ..engine.jobhash import from_ms, to_int
from ..engine.keyed import KeyLoad, key_loads
from ..engine.keys import validate_queue_name
from ..engine.logfields import log
from ..engine.overview import QueueSummary, summaries
from ..engine.schedules import registered_schedules
from ..engine.status import PENDING, PURGEABLE, STATUSES, Status
from ..engine.workers import any_alive, live_workers
from ..mirror.consumer import GROUP
from ..models import Job, QueuesDashboard
from ..runtime.schedule import Schedule
from .charts import lateness_chart, quantile, throughput_chart
from .display import clock, job_link, when

logger = logging.getLogger(__name__)

#: The periodic tasks listed: those a worker scheduled in the last day.
SCHEDULES_SEEN_MS = 86_400_000

REDIS_DOWN = "Redis is unreachable, so live queue state cannot be shown. Try again shortly."
#: What reading the live state may raise: Redis unreachable or refusing
#: (:class:`CommandRefused`), a name Redis holds that no queue can have.
READ_ERRORS = (DelayQError, ValueError)
OPERATIONS = ("pause", "resume", "purge")
#: A mirror whose consumer has not read for longer than this (ms) counts as stopped.
MIRROR_IDLE_MS = 60_000
#: Queues the dashboard shows per page (``?page=N``).
QUEUES_PER_PAGE = 100


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
    #: The busiest concurrency keys (docs/flow-control.md).
    keys: KeyLoad = field(default_factory=KeyLoad)
    #: Whether no live worker serves the queue (its jobs wait until one does).
    unserved: bool = False
    purgeable: int = field(init=False)

    def __post_init__(self) -> None:
        self.purgeable = sum(self.counts[s] for s in PURGEABLE)

    @property
    def count_list(self) -> list[tuple[str, int]]:
        return [(s, self.counts[s]) for s in STATUSES]

    @property
    def key_rows(self) -> list[tuple[str, int | str, str, int | str]]:
        """The busiest keys side by side: (running key, jobs, waiting key, jobs)."""
        active, waiting = self.keys.active, self.keys.waiting
        return [(*(active[i] if i < len(active) else ("", "")),
                 *(waiting[i] if i < len(waiting) else ("", "")))
                for i in range(max(len(active), len(waiting)))]

    @property
    def waiting_unserved(self) -> bool:
        """Jobs due or scheduled that no live worker will run."""
        return self.unserved and any(self.counts[s] for s in (*PENDING, Status.ACTIVE))

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "counts": self.counts, "paused": self.paused,
                "next_due": when(self.next_due) if self.next_due else "-",
                "completed_last_hour": self.completed_last_hour,
                "failed_last_hour": self.failed_last_hour, "chart": str(self.chart),
                "lateness_chart": str(self.lateness_chart),
                "lateness_p50": self.lateness_p50, "lateness_p95": self.lateness_p95,
                "skipped": self.skipped, "skipped_reasons": self.skipped_reasons,
                "unserved": self.unserved}


def queue_state(summary: QueueSummary, served: set[str] | None = None,
                keys: KeyLoad | None = None) -> QueueState:
    """What the dashboard shows of a queue read with ``detail`` (``served``: the queues
    some live worker serves; None: not asked; ``keys``: its busiest concurrency keys)."""
    lateness = summary.stats.lateness
    return QueueState(
        name=summary.name, counts=summary.counts, paused=summary.paused,
        next_due=summary.next_due, completed_last_hour=summary.completed_recently,
        failed_last_hour=summary.failed_recently, chart=throughput_chart(summary.throughput),
        lateness_chart=lateness_chart(lateness), lateness_p50=quantile(lateness, 0.5),
        lateness_p95=quantile(lateness, 0.95), skipped=summary.skipped,
        skipped_reasons=summary.skipped_reasons, keys=keys or KeyLoad(),
        unserved=served is not None and summary.name not in served)


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
    """Each periodic task a worker schedules (as recorded in Redis in the last
    :data:`SCHEDULES_SEEN_MS`): its schedule, next occurrence, and last run the mirror
    saw."""
    defs = registered_schedules(broker)
    if not defs:
        return []
    with broker.read_errors():
        now_ms = broker.server_time_ms()
    rows = []
    for name, d in sorted(defs.items()):
        if now_ms - to_int(d.get("seen_ms")) > SCHEDULES_SEEN_MS:
            continue  # no worker has run it for a day: removed from the code
        try:
            schedule = Schedule.from_spec(d)
            upcoming = when(from_ms(schedule.next_after(now_ms)))
        except (ValueError, TypeError, ImportError):
            continue
        last = (Job.objects.filter(task_name=name, job_id__startswith="cron:",
                                   started_at__isnull=False)
                .order_by("-started_at").only("job_id", "status", "started_at", "queue")
                .first())
        rows.append({"task": name, "queue": str(d.get("queue", "")),
                     "schedule": schedule.describe(),
                     "next": upcoming,
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
        log(logger, logging.WARNING, "admin: Redis unreachable", error=exc)
        return REDIS_DOWN
    log(logger, logging.WARNING, "admin: live queue state unavailable",
        error=f"{type(exc).__name__}: {exc}")
    if isinstance(exc, ValueError):  # a name in Redis that no queue can have
        return f"Live queue state is unavailable: {str(exc)[:200]}"
    # CommandRefused names redis-py's error first
    refusal = str(exc) if isinstance(exc, CommandRefused) else f"{type(exc).__name__}: {exc}"
    return f"Live queue state is unavailable: Redis refused a read ({refusal[:200]})."


def snapshot(page: int = 1) -> dict[str, Any]:
    """Everything the dashboard shows, read live (raises the engine's errors): the
    queues of one ``page`` (:data:`QUEUES_PER_PAGE` each), in a fixed number of round
    trips whatever the number of queues."""
    broker = get_broker()
    names = [q.name for q in Queue.all(broker=broker)]
    pages = max(1, -(-len(names) // QUEUES_PER_PAGE))
    page = min(max(1, page), pages)
    shown = names[(page - 1) * QUEUES_PER_PAGE:page * QUEUES_PER_PAGE]
    workers = live_workers(broker)
    served = {q for w in workers for q in w.queues}
    queues = [queue_state(s, served, keys) for s, keys in
              zip(summaries(broker, shown, detail=True), key_loads(broker, shown), strict=True)]
    mirror = mirror_state(broker, names)
    warnings = warnings_for(bool(workers), mirror)
    stranded = [q.name for q in queues if q.waiting_unserved]
    if workers and stranded:
        warnings.append(f"No live worker serves {len(stranded)} queue(s) with jobs waiting: "
                        f"{', '.join(stranded[:10])}{' ...' if len(stranded) > 10 else ''} "
                        "(runworker QUEUE... names the queues a worker serves).")
    return {"queues": queues, "workers": workers, "mirror": mirror, "warnings": warnings,
            "periodic": periodic_schedules(broker), "page": page, "pages": pages,
            "queue_count": len(names)}


def page_of(request: HttpRequest) -> int:
    """The page of queues a request asks for (``?page=N``; 1 when absent or bad)."""
    value = request.GET.get("page", "1")
    return int(value) if value.isdecimal() and 0 < len(value) < 7 else 1


class _AdminView(View):
    model_admin: admin.ModelAdmin[Any] | None = None  # the JobAdmin (jobs.py) serving it

    def context(self, request: HttpRequest, **extra: Any) -> dict[str, Any]:
        assert self.model_admin is not None
        opts = self.model_admin.model._meta
        return {**self.model_admin.admin_site.each_context(request), "opts": opts,
                "app_label": opts.app_label,
                "can_change": self.model_admin.has_change_permission(request),
                "can_purge": can_purge(request), **extra}

    def require(self, request: HttpRequest, *, change: bool, purge: bool = False) -> None:
        assert self.model_admin is not None
        allowed = (self.model_admin.has_change_permission(request) if change
                   else self.model_admin.has_view_or_change_permission(request))
        if not allowed or (purge and not can_purge(request)):
            raise PermissionDenied


def can_purge(request: HttpRequest) -> bool:
    """Purging deletes jobs: Django's delete permission on them (the job list itself
    deletes nothing, so its admin grants none)."""
    return bool(request.user.has_perm("django_delayq.delete_job"))


class QueuesView(_AdminView):
    """Every queue's live state, the workers alive, periodic schedules, and warnings."""

    def get(self, request: HttpRequest) -> HttpResponse:
        self.require(request, change=False)
        error = ""
        data: dict[str, Any] = {"queues": [], "workers": [], "warnings": [], "periodic": [],
                                "page": 1, "pages": 1}
        try:
            data = snapshot(page_of(request))
        except READ_ERRORS as exc:
            error = unavailable(exc)
        return TemplateResponse(request, "admin/django_delayq/queues.html", self.context(
            request, title="Queues", error=error, statuses=STATUSES, **data))


class QueuesDataView(_AdminView):
    """The dashboard's figures as JSON, for its script to refresh the page."""

    def get(self, request: HttpRequest) -> HttpResponse:
        self.require(request, change=False)
        try:
            data = snapshot(page_of(request))
        except READ_ERRORS as exc:
            return JsonResponse({"error": unavailable(exc)}, status=503)
        workers = [{"name": w.name, "host": w.host, "pid": w.pid,
                    "role": ("supervisor" if w.role == "supervisor" else
                             f"child of {w.supervisor}" if w.supervisor else "worker"),
                    "queues": ", ".join(w.queues), "concurrency": w.concurrency,
                    "busy": w.busy, "processed": w.processed, "failed": w.failed,
                    "heartbeat": when(w.heartbeat), "started": when(w.started),
                    "heartbeat_time": clock(w.heartbeat),
                    "running": [{"id": job_id, "url": job_link(queue, job_id, None)}
                                for queue, job_id in w.running],
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
        self.require(request, change=True, purge=operation == "purge")
        if operation != "purge":
            return HttpResponse("use POST", status=405, headers={"Allow": "POST"})
        try:
            state = queue_state(self._queue(queue).summary())
        except DelayQConnectionError:
            messages.error(request, REDIS_DOWN)
            return self._back()
        return TemplateResponse(request, "admin/django_delayq/purge_confirm.html", self.context(
            request, title=f"Purge queue {queue}?", queue=state, purgeable=PURGEABLE))

    def post(self, request: HttpRequest, queue: str, operation: str) -> HttpResponse:
        self.require(request, change=True, purge=operation == "purge")
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
                forget = request.POST.get("forget") == "yes"
                removed = target.purge(forget=forget)
                gone = " and forgotten" if forget and not Queue.seen(queue) else ""
                messages.success(request, f"Queue {queue} purged{gone}: {removed} job(s) "
                                          "deleted (running jobs were left alone).")
        except DelayQConnectionError:
            messages.error(request, REDIS_DOWN)
            return self._back()
        log(logger, logging.INFO, "admin queue operation", operation=operation, queue=queue,
            user=request.user.get_username())

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
