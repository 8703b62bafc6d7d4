"""The OpenAPI schema of the API (drf-spectacular), limited to django-delayq's endpoints."""

from __future__ import annotations

from typing import Any

from drf_spectacular.views import SpectacularAPIView
from rest_framework.renderers import BrowsableAPIRenderer

from .. import __version__
from .permissions import DelayQPermissionsMixin


def delayq_endpoints_only(endpoints: list[tuple[Any, ...]], **kwargs: Any) -> list[Any]:
    """drf-spectacular preprocessing hook: keep the endpoints of :mod:`django_delayq.api`."""
    return [
        (path, regex, method, callback) for path, regex, method, callback in endpoints
        if getattr(callback, "cls", None) is not None
        and callback.cls.__module__.startswith("django_delayq.api.views")
    ]


class SchemaView(DelayQPermissionsMixin, SpectacularAPIView):
    """The OpenAPI 3 schema (YAML by default, JSON with ``?format=json``).

    A browser (``Accept: text/html``) gets the YAML on a page of the browsable API
    instead of a file to download.
    """

    renderer_classes = [*SpectacularAPIView.renderer_classes, BrowsableAPIRenderer]

    custom_settings = {
        "TITLE": "django-delayq API",
        "DESCRIPTION": "Queues, jobs and workers of django-delayq.",
        "VERSION": __version__,
        "PREPROCESSING_HOOKS": ["django_delayq.api.schema.delayq_endpoints_only"],
        "ENUM_NAME_OVERRIDES": {
            "JobStatusEnum": "django_delayq.engine.status.JOB_STATUSES",
            "MirroredJobStatusEnum": "django_delayq.models.JobStatus",
        },
    }
