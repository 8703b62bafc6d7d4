"""Django app configuration: autodiscovers ``tasks`` modules and registers the checks."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules

import django_delayq

from .connection import get_broker
from .engine import set_default_broker


class DelayQConfig(AppConfig):
    name = "django_delayq"
    verbose_name = "Delayed jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Django app loading: the system checks register once the app is ready (where
        # Django's documentation registers them), not whenever this module is imported.
        from . import checks  # noqa: F401

        set_default_broker(get_broker)
        _bind_task_decorator()
        autodiscover_modules("tasks")


def _bind_task_decorator() -> None:
    """Make ``django_delayq.task`` the decorator again. Importing the submodule
    ``django_delayq.task`` before anyone asked for the decorator (the admin, loaded by
    an earlier app's ready(), does) binds the module to that name instead."""
    # Not at the top: importing the submodule as this module loads would bind the name
    # ``django_delayq.task`` to the module while Django imports every app's models, so
    # a models module's ``from django_delayq import task`` would get the module.
    from .task import task

    django_delayq.task = task
