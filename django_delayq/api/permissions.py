"""Who may use the API: the classes named by ``DELAYQ["API_PERMISSION_CLASSES"]``.

By default :class:`JobModelPermissions`: Django's model permissions of
``django_delayq.Job``, as the admin uses them.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.utils.module_loading import import_string
from rest_framework.permissions import SAFE_METHODS, BasePermission

from ..conf import conf


@cache
def _load(paths: tuple[str, ...]) -> tuple[type[BasePermission], ...]:
    return tuple(import_string(path) for path in paths)


def may_read_jobs(user: Any) -> bool:
    """Whether ``user`` holds a permission that shows jobs (``view_job``, ``change_job``)."""
    return bool(user.has_perm("django_delayq.view_job")
                or user.has_perm("django_delayq.change_job"))


class JobModelPermissions(BasePermission):
    """Django's model permissions of ``django_delayq.Job``, per request.

    ============================================  ===========================
    request                                       needs
    ============================================  ===========================
    any GET (queues, jobs, workers, the schema)   ``django_delayq.view_job``
                                                  (or ``change_job``)
    POST ``jobs/`` (enqueue)                      ``django_delayq.add_job``
    every other POST (pause, resume, cancel,      ``django_delayq.change_job``
    retry, reschedule)
    ============================================  ===========================

    Only active, signed-in users; a superuser holds every permission. A view declares
    ``write_permission = "add"`` when its POST adds a job.
    """

    message = "You do not have the django_delayq permission this needs."

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated and user.is_active):
            return False
        if request.method in SAFE_METHODS:
            return may_read_jobs(user)
        action = getattr(view, "write_permission", "change")
        return bool(user.has_perm(f"django_delayq.{action}_job"))


def permission_classes() -> tuple[type[BasePermission], ...]:
    """The configured permission classes (:class:`JobModelPermissions` by default), read
    on each call."""
    return _load(tuple(conf.API_PERMISSION_CLASSES))


class DelayQPermissionsMixin:
    """Use the configured permission classes, read per request (``override_settings``)."""

    def get_permissions(self) -> list[Any]:
        return [cls() for cls in permission_classes()]
