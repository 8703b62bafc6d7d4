"""The API's pages for people: the root that lists the endpoints, and the schema drawn by
Swagger UI and ReDoc from the files of ``drf-spectacular-sidecar`` (no CDN: they work
offline and under a strict Content-Security-Policy)."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.templatetags.static import static
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.reverse import reverse

from .base import DelayQAPIView
from .permissions import DelayQPermissionsMixin

#: Endpoint name in the root's answer -> URL name in ``django_delayq.api.urls``.
ROOT_LINKS = {
    "queues": "queue-list",
    "jobs": "job-list",
    "workers": "worker-list",
    "schema": "schema",
    "swagger": "swagger-ui",
    "redoc": "redoc",
}

SIDECAR_APPS = ("drf_spectacular", "drf_spectacular_sidecar")


def _url(request: Request, name: str) -> str:
    namespace = request.resolver_match.namespace if request.resolver_match else ""
    return reverse(f"{namespace}:{name}" if namespace else name, request=request)


class APIRootView(DelayQAPIView):
    """The endpoints of the API, as absolute URLs."""

    @extend_schema(exclude=True)
    def get(self, request: Request) -> Response:
        return Response({key: _url(request, name) for key, name in ROOT_LINKS.items()})


def _sidecar(filepath: str) -> str:
    missing = [app for app in SIDECAR_APPS if not apps.is_installed(app)]
    if missing:
        raise ImproperlyConfigured(
            "The API's Swagger UI and ReDoc pages need " + " and ".join(map(repr, missing))
            + " in INSTALLED_APPS (pip install 'django-delayq[api]').")
    return static(f"drf_spectacular_sidecar/{filepath}")


class SwaggerView(DelayQPermissionsMixin, SpectacularSwaggerView):
    """Swagger UI for the schema, its scripts served from the sidecar's static files."""

    title = "django-delayq API"

    def _get_schema_url(self, request: Request) -> Any:
        return _url(request, "schema")

    @staticmethod
    def _swagger_ui_resource(filename: str) -> str:
        return _sidecar(f"swagger-ui-dist/{filename}")

    @staticmethod
    def _swagger_ui_favicon() -> str:
        return _sidecar("swagger-ui-dist/favicon-32x32.png")


class RedocView(DelayQPermissionsMixin, SpectacularRedocView):
    """ReDoc for the schema, its script served from the sidecar's static files."""

    template_name = "django_delayq/api/redoc.html"
    title = "django-delayq API"

    def _get_schema_url(self, request: Request) -> Any:
        return _url(request, "schema")

    @staticmethod
    def _redoc_standalone() -> str:
        return _sidecar("redoc/bundles/redoc.standalone.js")
