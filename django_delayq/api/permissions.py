"""Who may use the API: the classes named by ``DELAYQ["API_PERMISSION_CLASSES"]``."""

from __future__ import annotations

from functools import cache
from typing import Any

from django.utils.module_loading import import_string
from rest_framework.permissions import BasePermission

from ..conf import conf


@cache
def _load(paths: tuple[str, ...]) -> tuple[type[BasePermission], ...]:
    return tuple(import_string(path) for path in paths)


def permission_classes() -> tuple[type[BasePermission], ...]:
    """The configured permission classes (``IsAdminUser`` by default), read on each call."""
    return _load(tuple(conf.API_PERMISSION_CLASSES))


class DelayQPermissionsMixin:
    """Use the configured permission classes, read per request (``override_settings``)."""

    def get_permissions(self) -> list[Any]:
        return [cls() for cls in permission_classes()]
