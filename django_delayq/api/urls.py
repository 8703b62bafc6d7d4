"""URLs of the API. Mount with ``path("api/delayq/", include("django_delayq.api.urls"))``.

Jobs are addressed by queue and job id: ``jobs/<queue>/<job_id>/`` (job ids may hold
``/``, so the action URLs end in a fixed word).
"""

from __future__ import annotations

from django.urls import path, register_converter

from ..engine.keys import validate_job_id
from . import views
from .docs import APIRootView, RedocView, SwaggerView
from .schema import SchemaView


class QueueNameConverter:
    regex = r"[A-Za-z0-9_.\-]{1,64}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class JobIdConverter(QueueNameConverter):
    regex = r"[A-Za-z0-9_.:@+=/\-]{1,128}"

    def to_python(self, value: str) -> str:
        # The engine's whole rule (no empty, '.' or '..' part): a ValueError is no match,
        # so ``jobs/q/0//`` is a 404, not a 500 from the view.
        return validate_job_id(value)


register_converter(QueueNameConverter, "delayq_queue")
register_converter(JobIdConverter, "delayq_job")

app_name = "delayq-api"

urlpatterns = [
    path("", APIRootView.as_view(), name="root"),
    path("queues/", views.QueueListView.as_view(), name="queue-list"),
    path("queues/<delayq_queue:queue>/", views.QueueDetailView.as_view(), name="queue-detail"),
    path("queues/<delayq_queue:queue>/pause/", views.QueuePauseView.as_view(),
         name="queue-pause"),
    path("queues/<delayq_queue:queue>/resume/", views.QueueResumeView.as_view(),
         name="queue-resume"),
    path("jobs/", views.JobListView.as_view(), name="job-list"),
    path("jobs/<delayq_queue:queue>/<delayq_job:job_id>/cancel/", views.JobCancelView.as_view(),
         name="job-cancel"),
    path("jobs/<delayq_queue:queue>/<delayq_job:job_id>/abort/", views.JobAbortView.as_view(),
         name="job-abort"),
    path("jobs/<delayq_queue:queue>/<delayq_job:job_id>/retry/", views.JobRetryView.as_view(),
         name="job-retry"),
    path("jobs/<delayq_queue:queue>/<delayq_job:job_id>/reschedule/",
         views.JobRescheduleView.as_view(), name="job-reschedule"),
    path("jobs/<delayq_queue:queue>/<delayq_job:job_id>/", views.JobDetailView.as_view(),
         name="job-detail"),
    path("workers/", views.WorkerListView.as_view(), name="worker-list"),
    path("schema/", SchemaView.as_view(), name="schema"),
    path("schema/swagger/", SwaggerView.as_view(), name="swagger-ui"),
    path("schema/redoc/", RedocView.as_view(), name="redoc"),
]
