"""The API endpoints: queues, jobs and workers.

Queue state and job state are read live from Redis; the job list (history, filters)
comes from the mirrored ``django_delayq.Job`` table. Engine errors become HTTP errors in
:class:`~django_delayq.api.base.DelayQAPIView`: Redis unreachable 503, unknown job 404,
a state that forbids the action 409.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.generics import GenericAPIView
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response

from ..conf import django_time
from ..connection import get_broker
from ..engine import Job, JobNotFound, Queue
from ..engine.keyed import KeyLoad
from ..engine.logfields import log
from ..engine.overview import QueueSummary, summaries
from ..engine.status import PENDING
from ..engine.workers import live_workers
from ..models import Job as MirroredJob
from ..task import registered, registry
from ..workflows.view import workflow
from . import serializers as s
from .base import Conflict, DelayQAPIView, document
from .permissions import may_read_jobs

logger = logging.getLogger("django_delayq.api")

ERRORS = {
    401: OpenApiResponse(s.ErrorSerializer, description="Not authenticated."),
    403: OpenApiResponse(s.ErrorSerializer, description="Not allowed: by default reading "
                         "needs django_delayq.view_job, enqueuing add_job, other writes "
                         "change_job."),
    503: OpenApiResponse(s.ErrorSerializer, description="Redis is unreachable."),
}
NOT_FOUND = {404: OpenApiResponse(s.ErrorSerializer, description="Unknown queue or job.")}
BAD_REQUEST = {400: OpenApiResponse(description="Invalid input, by field.")}
CONFLICT = {409: OpenApiResponse(s.ErrorSerializer,
                                 description="The job's status does not allow this.")}


# -- queues --------------------------------------------------------------------------


def known_queue(name: str) -> Queue:
    """The queue ``name`` if Redis has seen it or a registered task uses it, else 404."""
    broker = get_broker()
    if name not in registry.queues() and not Queue.seen(name, broker=broker):
        raise NotFound(f"No queue named {name!r}.")
    return Queue(name, broker=broker)


def queue_data(summary: QueueSummary, *, keys: KeyLoad | None = None) -> dict[str, Any]:
    """A queue as the API shows it; with its busiest concurrency ``keys``, the detail of
    one queue (throughput, skipped events, tasks, keys)."""
    data: dict[str, Any] = {
        "name": summary.name, "counts": summary.counts, "paused": summary.paused,
        "next_due": summary.next_due, "shards": summary.shards,
    }
    if keys is not None:
        data["mirror_skipped"] = {"count": summary.skipped, "last": summary.skipped_reasons}
        data["tasks"] = [t.name for t in registry.tasks() if t.queue_name == summary.name]
        data["throughput"] = [{"minute": m, "completed": c, "failed": f}
                              for m, c, f in summary.throughput]
        data["keys"] = {"active": [{"key": k, "jobs": n} for k, n in keys.active],
                        "waiting": [{"key": k, "jobs": n} for k, n in keys.waiting],
                        "waiting_total": keys.waiting_total}
    return data


class QueuePagination(LimitOffsetPagination):
    default_limit = 100
    max_limit = 1_000


class QueueListView(DelayQAPIView):
    @document(summary="List queues", operation_id="queues_list", parameters=[
        OpenApiParameter("limit", int, description="Queues per page (default 100, at most "
                                                   "1,000)."),
        OpenApiParameter("offset", int, description="Queues to skip, by name.")],
              responses={200: s.QueuePageSerializer, **ERRORS})
    def get(self, request: Request) -> Response:
        """Every queue seen in Redis or used by a registered task, by name, with live
        counts; paginated (``limit``, ``offset``), each page read in one round trip."""
        broker = get_broker()
        names = sorted({q.name for q in Queue.all(broker=broker)} | set(registry.queues()))
        pages = QueuePagination()
        page = pages.paginate_queryset(names, request, view=self) or []
        data = [queue_data(summary) for summary in summaries(broker, page)]
        return pages.get_paginated_response(s.QueueSerializer(data, many=True).data)


class QueueDetailView(DelayQAPIView):
    @document(summary="Show a queue",
                   responses={200: s.QueueDetailSerializer, **NOT_FOUND, **ERRORS})
    def get(self, request: Request, queue: str) -> Response:
        """Live counts, pause state, next due time, tasks and throughput of one queue."""
        found = known_queue(queue)
        return Response(s.QueueDetailSerializer(queue_data(found.summary(),
                                                           keys=found.key_load())).data)


def _pause(request: Request, queue: str, paused: bool) -> Response:
    """Pause or resume a queue, logged with who asked; the queue as it now is."""
    q = known_queue(queue)
    if paused:
        q.pause()
    else:
        q.resume()
    log(logger, logging.INFO, "queue paused" if paused else "queue resumed", queue=queue,
        user=request.user.get_username())
    return Response(s.QueueSerializer(queue_data(q.summary(detail=False))).data)


class QueuePauseView(DelayQAPIView):
    @document(summary="Pause a queue", request=None,
                   responses={200: s.QueueSerializer, **NOT_FOUND, **ERRORS})
    def post(self, request: Request, queue: str) -> Response:
        """Stop workers from claiming jobs of this queue (enqueuing still works)."""
        return _pause(request, queue, paused=True)


class QueueResumeView(DelayQAPIView):
    @document(summary="Resume a queue", request=None,
                   responses={200: s.QueueSerializer, **NOT_FOUND, **ERRORS})
    def post(self, request: Request, queue: str) -> Response:
        """Let workers claim jobs of this queue again."""
        return _pause(request, queue, paused=False)


# -- jobs ----------------------------------------------------------------------------


class JobPagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 500


class JobListView(DelayQAPIView, GenericAPIView):
    pagination_class = JobPagination
    write_permission = "add"  # POST enqueues: django_delayq.add_job
    serializer_class = s.MirroredJobSerializer

    def get_serializer_class(self) -> type[Any]:
        """The job row for the list; the enqueue body for the browsable API's POST form."""
        return s.EnqueueSerializer if self.request.method == "POST" else self.serializer_class

    def get_queryset(self) -> QuerySet[MirroredJob]:
        filters = self.parsed(s.JobFilterSerializer, self.request.query_params)
        qs = MirroredJob.objects.all()
        if "queue" in filters:
            qs = qs.filter(queue=filters["queue"])
        if "status" in filters:
            qs = qs.filter(status=filters["status"])
        if "task" in filters:
            qs = qs.filter(task_name=filters["task"])
        if "run_at_after" in filters:
            qs = qs.filter(run_at__gte=django_time(filters["run_at_after"]))
        if "run_at_before" in filters:
            qs = qs.filter(run_at__lt=django_time(filters["run_at_before"]))
        return qs.order_by("-enqueued_at", "-id")

    @document(summary="List jobs (history)", parameters=[s.JobFilterSerializer],
                   responses={200: s.MirroredJobSerializer(many=True), **BAD_REQUEST, **ERRORS})
    def get(self, request: Request) -> Response:
        """Jobs from the mirrored table, newest first, filtered and paginated."""
        page = self.paginate_queryset(self.get_queryset())
        return self.get_paginated_response(self.get_serializer(page, many=True).data)

    @document(summary="Enqueue a job", request=s.EnqueueSerializer,
                   responses={201: s.EnqueuedJobSerializer,
                              200: OpenApiResponse(s.EnqueuedJobSerializer,
                                                   description="A job with this job_id "
                                                               "exists: nothing was added. "
                                                               "Without view_job or "
                                                               "change_job, only its id, "
                                                               "queue and created."),
                              **BAD_REQUEST, **ERRORS})
    def post(self, request: Request) -> Response:
        """Enqueue a job of a registered task; arguments are checked against its signature."""
        data = self.parsed(s.EnqueueSerializer, request.data)
        task = registered(data["task"])
        options = {k: data[k] for k in ("queue", "priority", "job_id", "max_attempts",
                                         "run_at", "delay") if data.get(k) is not None}
        try:
            job = task.using(**options).enqueue(*data["args"], **data["kwargs"])
        except (TypeError, ValueError) as exc:  # e.g. arguments over MAX_PAYLOAD_BYTES
            raise ValidationError({"non_field_errors": [str(exc)]}) from None
        log(logger, logging.INFO, "job enqueued", job=job.id, queue=job.queue,
            task=job.task_name, created=job.created, user=request.user.get_username())
        if not job.created:
            if not may_read_jobs(request.user):  # it may add jobs, not read them
                return Response({"id": job.id, "queue": job.queue, "created": False})
            job.refresh()
        body = s.EnqueuedJobSerializer(job).data
        return Response(body, status=status.HTTP_201_CREATED if job.created else status.HTTP_200_OK)


class JobDetailView(DelayQAPIView):
    @document(summary="Show a job", responses={200: s.JobDetailSerializer, **NOT_FOUND,
                                                    **ERRORS})
    def get(self, request: Request, queue: str, job_id: str) -> Response:
        """The job's live state in Redis next to its mirrored row (either may be null)."""
        live: Job | None
        try:
            live = Job.fetch(job_id, queue)
        except JobNotFound:
            live = None
        position = live.position() if live is not None and live.status in PENDING else None
        mirror = MirroredJob.objects.filter(queue=queue, job_id=job_id).first()
        if live is None and mirror is None:
            raise NotFound(f"No job {job_id!r} in queue {queue!r}.")
        data = {"queue": queue, "job_id": job_id, "live": live, "position": position,
                "mirror": mirror, "workflow": workflow(queue, job_id, live, mirror)}
        return Response(s.JobDetailSerializer(data).data)


class JobCancelView(DelayQAPIView):
    @document(summary="Cancel a job", request=None,
                   responses={200: s.LiveJobSerializer, **NOT_FOUND, **CONFLICT, **ERRORS})
    def post(self, request: Request, queue: str, job_id: str) -> Response:
        """Cancel a waiting, scheduled or ready job (409 once it started or finished); the
        jobs that wait for it follow their policy."""
        job = Job(id=job_id, queue=queue)
        if not job.cancel():
            raise Conflict(f"Job {job_id!r} is {job.status}: only a waiting, scheduled or "
                           "ready job can be cancelled (abort/ stops a running one).")
        log(logger, logging.INFO, "job cancelled", job=job_id, queue=queue,
            user=request.user.get_username())
        return Response(s.LiveJobSerializer(job.refresh()).data)


class JobAbortView(DelayQAPIView):
    @document(summary="Abort a job", request=None,
                   responses={200: s.LiveJobSerializer, **NOT_FOUND, **CONFLICT, **ERRORS})
    def post(self, request: Request, queue: str, job_id: str) -> Response:
        """Stop a job: one that has not started is cancelled at once; a running one is
        asked to stop and ends cancelled within seconds (its process replaced if it does
        not stop by itself). 409 once it finished. ``aborted_by`` names the user."""
        job = Job(id=job_id, queue=queue)
        if not job.abort(by=f"{request.user.get_username()} (api)"):
            raise Conflict(f"Job {job_id!r} is {job.status}: it finished already.")
        log(logger, logging.INFO, "job abort asked", job=job_id, queue=queue,
            status=job.status, user=request.user.get_username())
        return Response(s.LiveJobSerializer(job.refresh()).data)


class JobRetryView(DelayQAPIView):
    form_serializer = s.RetrySerializer

    @document(summary="Retry a job", request=s.RetrySerializer,
                   responses={200: s.LiveJobSerializer, **BAD_REQUEST, **NOT_FOUND,
                              **CONFLICT, **ERRORS})
    def post(self, request: Request, queue: str, job_id: str) -> Response:
        """Run a failed or cancelled job again (now, or at run_at / after delay)."""
        data = self.parsed(s.RetrySerializer, request.data)
        job = Job(id=job_id, queue=queue)
        job.retry(run_at=data.get("run_at"), delay=data.get("delay"))
        log(logger, logging.INFO, "job retried", job=job_id, queue=queue,
            user=request.user.get_username())
        return Response(s.LiveJobSerializer(job.refresh()).data)


class JobRescheduleView(DelayQAPIView):
    form_serializer = s.RescheduleSerializer

    @document(summary="Reschedule a job", request=s.RescheduleSerializer,
                   responses={200: s.LiveJobSerializer, **BAD_REQUEST, **NOT_FOUND,
                              **CONFLICT, **ERRORS})
    def post(self, request: Request, queue: str, job_id: str) -> Response:
        """Move a job that has not started to run_at (or delay seconds from now)."""
        data = self.parsed(s.RescheduleSerializer, request.data)
        job = Job(id=job_id, queue=queue)
        job.reschedule(run_at=data.get("run_at"), delay=data.get("delay"),
                       priority=data.get("priority"))
        log(logger, logging.INFO, "job rescheduled", job=job_id, queue=queue,
            run_at=job.run_at.isoformat() if job.run_at else None,
            user=request.user.get_username())
        return Response(s.LiveJobSerializer(job.refresh()).data)


# -- workers -------------------------------------------------------------------------


class WorkerListView(DelayQAPIView):
    @document(summary="List live workers",
                   responses={200: s.WorkerSerializer(many=True), **ERRORS})
    def get(self, request: Request) -> Response:
        """Workers whose heartbeat is recent (their record expires a while after they die),
        newest heartbeat first."""
        workers = live_workers(get_broker())
        return Response(s.WorkerSerializer(workers, many=True).data)
