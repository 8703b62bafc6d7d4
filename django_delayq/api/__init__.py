"""The REST API of django-delayq (Django REST framework), an optional extra.

Mount it with ``path("api/delayq/", include("django_delayq.api.urls"))``. Django's model
permissions of ``django_delayq.Job`` by default (``DELAYQ["API_PERMISSION_CLASSES"]``);
the OpenAPI schema is at
``schema/`` under the same prefix.
"""

from __future__ import annotations

from ..engine.errors import ExtraMissing

try:
    import drf_spectacular  # noqa: F401
    import rest_framework  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ExtraMissing("django_delayq.api", "Django REST framework and drf-spectacular",
                       "api") from exc
