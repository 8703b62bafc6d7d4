"""The throwaway Redis of the test session, started when the test settings load.

The test settings load before any conftest (pytest-django imports them first), so the
server starts here. ``REDIS_URL`` names an existing server to use instead (its database
is flushed by the tests). Worker processes started by the tests inherit
``DELAYQ_TEST_REDIS_URL`` and start nothing.
"""

from __future__ import annotations

import atexit
import os


def session_redis_url() -> str:
    """The URL of the Redis the tests use, starting a throwaway server if needed."""
    url = os.environ.get("DELAYQ_TEST_REDIS_URL") or os.environ.get("REDIS_URL")
    if not url:
        from django_delayq.testing import RedisServer

        server = RedisServer().start()
        atexit.register(server.cleanup)
        url = server.url
    os.environ["DELAYQ_TEST_REDIS_URL"] = url
    return url



