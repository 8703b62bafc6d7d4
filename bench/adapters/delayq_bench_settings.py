"""Django settings for the django-delayq side of the benchmark (adapter and worker)."""

from __future__ import annotations

import os
from pathlib import Path

import common

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_delayq", "delayq_benchapp"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(Path(__file__).resolve().parent.parent / "results" / "tmp" / "delayq.sqlite3"),
    }
}
DELAYQ = {"REDIS_URL": os.environ.get(common.URL_ENV, "redis://127.0.0.1:1/0")}
LOGGING_CONFIG = None
