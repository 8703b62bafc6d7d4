"""Settings of the test project. conftest.py starts the Redis it points at (importing
these settings starts nothing: processes the tests start are given the server's URL in
``DELAYQ_TEST_REDIS_URL``)."""

from __future__ import annotations

import json
import os

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
ALLOWED_HOSTS = ["*"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_delayq",
    "tests.testapp",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
]

try:  # Django 6 ships the Tasks framework; Django 5.2 uses the django-tasks backport
    import django.tasks  # noqa: F401
except ImportError:
    INSTALLED_APPS.append("django_tasks")

TASKS = {
    "default": {
        "BACKEND": "django_delayq.backends.DelayQBackend",
        "QUEUES": ["default", "other", "async"],
    }
}

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("DELAYQ_TEST_SQLITE", ":memory:"),
    }
}

STATIC_URL = "/static/"

DELAYQ = {
    "REDIS_URL": os.environ.get("DELAYQ_TEST_REDIS_URL") or os.environ.get("REDIS_URL", ""),
    "CONCURRENCY": 4,
    "BLOCK_TIMEOUT": 1.0,
    "RETRY_BACKOFF": 0.05,
    "RETRY_BACKOFF_MAX": 0.2,
}
# More DELAYQ settings (a JSON object) for worker processes a test starts.
DELAYQ.update(json.loads(os.environ.get("DELAYQ_TEST_SETTINGS", "{}")))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_delayq": {"handlers": ["stderr"], "level": "INFO"}},
}
