"""Settings of django-delayq, read from ``settings.DELAYQ`` on every access.

Reading on access (not at import) keeps ``override_settings`` working in tests. Every
setting has a documented default and a system check in :mod:`django_delayq.checks`.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

DEFAULTS: dict[str, Any] = {
    # Connection: a Redis URL (redis://, rediss:// for TLS, unix://), or a django-redis
    # cache alias whose connection settings are reused.
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "CACHE_ALIAS": None,
    # Seconds a Redis command may take before enqueue raises DelayQConnectionError.
    "SOCKET_TIMEOUT": 5.0,
    "SOCKET_CONNECT_TIMEOUT": 2.0,
    # Prefix of every Redis key (inside the hash tag: {prefix:queue}).
    "PREFIX": "dq",
    "DEFAULT_QUEUE": "default",
    # Permission classes (dotted paths) of the REST API (django_delayq.api).
    "API_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    # Attempts per job (the first run included) and the retry backoff, in seconds:
    # min(RETRY_BACKOFF_MAX, RETRY_BACKOFF * 2 ** (attempt - 1)), jittered down to half.
    "MAX_ATTEMPTS": 3,
    "RETRY_BACKOFF": 2.0,
    "RETRY_BACKOFF_MAX": 600.0,
    # Seconds a claimed job stays leased; running jobs are renewed by the heartbeat.
    "LEASE": 30.0,
    # Worker defaults.
    "CONCURRENCY": 4,
    "GRACE_PERIOD": 30.0,
    "BLOCK_TIMEOUT": 2.0,
    # Retention in Redis, in seconds and counts.
    "RESULT_TTL": 86_400,
    "FAILED_TTL": 7 * 86_400,
    "KEEP_COMPLETED": 10_000,
    "KEEP_FAILED": 100_000,
    "EVENTS_MAXLEN": 100_000,
    # Largest encoded arguments accepted at enqueue, in bytes (0: no limit).
    "MAX_PAYLOAD_BYTES": 1_048_576,
    # Shards per queue name, e.g. {"emails": 4}.
    "SHARDS": {},
    # Flow control per queue name: {"emails": {"rate_limit": "100/m"},
    # "api": {"interval": 0.5, "shards": 4}} (see docs/flow-control.md). "shards" here
    # takes precedence over SHARDS.
    "QUEUES": {},
    # True when REDIS_URL names one node of a Redis Cluster (or use redis+cluster://).
    "CLUSTER": False,
    # Seconds ahead a worker enqueues the next occurrences of periodic tasks, and what
    # happens to occurrences missed while no worker ran: "latest" (run the most recent
    # one once), "all" (run each, at most CRON_CATCH_UP_MAX) or "skip".
    "CRON_LOOKAHEAD": 30.0,
    "CRON_MISSED": "latest",
    "CRON_CATCH_UP_MAX": 100,
    # The model mirror: seconds finished rows are kept in the database (None: forever),
    # events read per batch, and seconds another mirror's unacknowledged events may sit
    # before this one takes them over.
    "MIRROR_RETENTION": 30 * 86_400,
    "MIRROR_BATCH_SIZE": 500,
    "MIRROR_CLAIM_IDLE": 60.0,
    # Spark master URL of the Spark pipeline's commands (local[*], spark://host:7077,
    # yarn, k8s://...); --master overrides it.
    "SPARK_MASTER": "local[*]",
}


class DelayQSettings:
    """``settings.DELAYQ`` with defaults, one property per setting."""

    def _get(self, name: str) -> Any:
        user = getattr(settings, "DELAYQ", None) or {}
        return user.get(name, DEFAULTS[name])

    @property
    def REDIS_URL(self) -> str:
        return str(self._get("REDIS_URL"))

    @property
    def CACHE_ALIAS(self) -> str | None:
        value = self._get("CACHE_ALIAS")
        return None if value is None else str(value)

    @property
    def SOCKET_TIMEOUT(self) -> float:
        return float(self._get("SOCKET_TIMEOUT"))

    @property
    def SOCKET_CONNECT_TIMEOUT(self) -> float:
        return float(self._get("SOCKET_CONNECT_TIMEOUT"))

    @property
    def PREFIX(self) -> str:
        return str(self._get("PREFIX"))

    @property
    def DEFAULT_QUEUE(self) -> str:
        return str(self._get("DEFAULT_QUEUE"))

    @property
    def API_PERMISSION_CLASSES(self) -> list[str]:
        return [str(path) for path in self._get("API_PERMISSION_CLASSES")]

    @property
    def MAX_ATTEMPTS(self) -> int:
        return int(self._get("MAX_ATTEMPTS"))

    @property
    def RETRY_BACKOFF(self) -> float:
        return float(self._get("RETRY_BACKOFF"))

    @property
    def RETRY_BACKOFF_MAX(self) -> float:
        return float(self._get("RETRY_BACKOFF_MAX"))

    @property
    def LEASE(self) -> float:
        return float(self._get("LEASE"))

    @property
    def CONCURRENCY(self) -> int:
        return int(self._get("CONCURRENCY"))

    @property
    def GRACE_PERIOD(self) -> float:
        return float(self._get("GRACE_PERIOD"))

    @property
    def BLOCK_TIMEOUT(self) -> float:
        return float(self._get("BLOCK_TIMEOUT"))

    @property
    def RESULT_TTL(self) -> float:
        return float(self._get("RESULT_TTL"))

    @property
    def FAILED_TTL(self) -> float:
        return float(self._get("FAILED_TTL"))

    @property
    def KEEP_COMPLETED(self) -> int:
        return int(self._get("KEEP_COMPLETED"))

    @property
    def KEEP_FAILED(self) -> int:
        return int(self._get("KEEP_FAILED"))

    @property
    def EVENTS_MAXLEN(self) -> int:
        return int(self._get("EVENTS_MAXLEN"))

    @property
    def MAX_PAYLOAD_BYTES(self) -> int:
        return int(self._get("MAX_PAYLOAD_BYTES"))

    @property
    def SHARDS(self) -> dict[str, int]:
        return dict(self._get("SHARDS"))

    @property
    def QUEUES(self) -> dict[str, dict[str, Any]]:
        return dict(self._get("QUEUES"))

    @property
    def CLUSTER(self) -> bool:
        return bool(self._get("CLUSTER"))

    @property
    def CRON_LOOKAHEAD(self) -> float:
        return float(self._get("CRON_LOOKAHEAD"))

    @property
    def CRON_MISSED(self) -> str:
        return str(self._get("CRON_MISSED"))

    @property
    def CRON_CATCH_UP_MAX(self) -> int:
        return int(self._get("CRON_CATCH_UP_MAX"))

    @property
    def MIRROR_RETENTION(self) -> float | None:
        value = self._get("MIRROR_RETENTION")
        return None if value is None else float(value)

    @property
    def MIRROR_BATCH_SIZE(self) -> int:
        return int(self._get("MIRROR_BATCH_SIZE"))

    @property
    def MIRROR_CLAIM_IDLE(self) -> float:
        return float(self._get("MIRROR_CLAIM_IDLE"))

    @property
    def SPARK_MASTER(self) -> str:
        return str(self._get("SPARK_MASTER"))

    def raw(self, name: str) -> Any:
        """The setting as given (unconverted), for the system checks."""
        return self._get(name)


conf = DelayQSettings()
