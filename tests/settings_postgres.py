"""The test settings on PostgreSQL: the server of ``DELAYQ_TEST_PG_HOST/PORT/USER``, which
the suite sets to the throwaway server it starts (tests/services.py) unless
``DELAYQ_TEST_PG_URL`` names one; trust auth.

Used by ``tests/test_mirror.py`` through ``pytest --ds=tests.settings_postgres``. The
database name carries the process id so concurrent runs do not share a test database;
processes started by a test get the test database's name in ``DELAYQ_TEST_PG_NAME``.
"""

from __future__ import annotations

import os

from tests.settings import *  # noqa: F403

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("DELAYQ_TEST_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DELAYQ_TEST_PG_PORT", "5432"),
        "USER": os.environ.get("DELAYQ_TEST_PG_USER", "postgres"),
        "NAME": os.environ.get("DELAYQ_TEST_PG_NAME") or f"delayq_{os.getpid()}",
    }
}
