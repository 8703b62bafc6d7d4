"""Django app configuration: autodiscovers ``tasks`` modules and registers the checks."""

from __future__ import annotations

from django.apps import AppConfig
from django.utils.module_loading import autodiscover_modules


class DelayQConfig(AppConfig):
    name = "django_delayq"
    verbose_name = "Delayed jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401 - registers the system checks
        from .connection import get_broker
        from .engine import set_default_broker

        set_default_broker(get_broker)
        autodiscover_modules("tasks")
