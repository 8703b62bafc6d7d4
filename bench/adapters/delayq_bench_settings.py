"""Django settings for the django-delayq side of the benchmark (adapter and worker)."""

from __future__ import annotations

import os

from bench.harness.marks import URL_ENV
from bench.harness.processes import LOG_DIR

SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = ["django_delayq", "delayq_benchapp"]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": str(LOG_DIR / "delayq.sqlite3"),
    }
}
DELAYQ = {"REDIS_URL": os.environ.get(URL_ENV, "redis://127.0.0.1:1/0")}
LOGGING_CONFIG = None
