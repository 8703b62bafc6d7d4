"""System checks for ``settings.DELAYQ``: each problem has a stable id."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
from django.utils.module_loading import import_string

from .conf import DEFAULTS, conf
from .engine.keys import QUEUE_NAME_RE
from .engine.limits import queue_options

REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def _number(name: str, *, minimum: float, integer: bool = False) -> list[CheckMessage]:
    value = conf.raw(name)
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value < minimum:
        what = "an int" if integer else "a number"
        return [Error(f"DELAYQ[{name!r}] must be {what} >= {minimum}, not {value!r}.",
                      id=f"django_delayq.{_IDS[name]}")]
    return []


_IDS = {
    "REDIS_URL": "E002",
    "CACHE_ALIAS": "E003",
    "SOCKET_TIMEOUT": "E004",
    "SOCKET_CONNECT_TIMEOUT": "E005",
    "PREFIX": "E006",
    "DEFAULT_QUEUE": "E007",
    "MAX_ATTEMPTS": "E008",
    "RETRY_BACKOFF": "E009",
    "RETRY_BACKOFF_MAX": "E010",
    "LEASE": "E011",
    "CONCURRENCY": "E012",
    "GRACE_PERIOD": "E013",
    "BLOCK_TIMEOUT": "E014",
    "RESULT_TTL": "E015",
    "FAILED_TTL": "E016",
    "KEEP_COMPLETED": "E017",
    "KEEP_FAILED": "E018",
    "EVENTS_MAXLEN": "E019",
    "MAX_PAYLOAD_BYTES": "E020",
    "SHARDS": "E021",
    "QUEUES": "E023",
    "CLUSTER": "E024",
    "CRON_LOOKAHEAD": "E025",
    "CRON_MISSED": "E026",
    "CRON_CATCH_UP_MAX": "E027",
    "MIRROR_RETENTION": "E030",
    "MIRROR_BATCH_SIZE": "E031",
    "MIRROR_CLAIM_IDLE": "E032",
}


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Validate every key of ``settings.DELAYQ``."""
    user = getattr(settings, "DELAYQ", None)
    if user is None:
        return []
    if not isinstance(user, dict):
        return [Error(f"settings.DELAYQ must be a dict, not {type(user).__name__}.",
                      id="django_delayq.E001")]
    errors: list[CheckMessage] = []
    unknown = sorted(set(user) - set(DEFAULTS) - _EXTENSION_KEYS)
    if unknown:
        errors.append(Error(f"Unknown DELAYQ settings: {', '.join(unknown)}.",
                            hint=f"Known settings: {', '.join(sorted(DEFAULTS))}.",
                            id="django_delayq.E022"))
    url = conf.raw("REDIS_URL")
    if not isinstance(url, str) or urlsplit(url).scheme not in REDIS_SCHEMES:
        errors.append(Error(f"DELAYQ['REDIS_URL'] must be a redis://, rediss://, unix:// or "
                            f"redis+cluster:// URL, not {url!r}.", id="django_delayq.E002"))
    alias = conf.raw("CACHE_ALIAS")
    if alias is not None and alias not in getattr(settings, "CACHES", {}):
        errors.append(Error(f"DELAYQ['CACHE_ALIAS'] {alias!r} is not in settings.CACHES.",
                            id="django_delayq.E003"))
    for name in ("SOCKET_TIMEOUT", "SOCKET_CONNECT_TIMEOUT", "LEASE", "BLOCK_TIMEOUT"):
        errors += _number(name, minimum=0.1)
    for name in ("RETRY_BACKOFF", "RETRY_BACKOFF_MAX", "GRACE_PERIOD", "RESULT_TTL",
                 "FAILED_TTL"):
        errors += _number(name, minimum=0)
    for name in ("MAX_ATTEMPTS", "CONCURRENCY"):
        errors += _number(name, minimum=1, integer=True)
    for name in ("KEEP_COMPLETED", "KEEP_FAILED", "EVENTS_MAXLEN", "MAX_PAYLOAD_BYTES"):
        errors += _number(name, minimum=0, integer=True)
    if conf.raw("MIRROR_RETENTION") is not None:
        errors += _number("MIRROR_RETENTION", minimum=0)
    errors += _number("MIRROR_BATCH_SIZE", minimum=1, integer=True)
    errors += _number("MIRROR_CLAIM_IDLE", minimum=0)
    prefix = conf.raw("PREFIX")
    if not isinstance(prefix, str) or not QUEUE_NAME_RE.match(prefix):
        errors.append(Error(f"DELAYQ['PREFIX'] must be 1-64 characters from A-Z a-z 0-9 _ . -, "
                            f"not {prefix!r}.", id="django_delayq.E006"))
    queue = conf.raw("DEFAULT_QUEUE")
    if not isinstance(queue, str) or not QUEUE_NAME_RE.match(queue):
        errors.append(Error(f"DELAYQ['DEFAULT_QUEUE'] is not a valid queue name: {queue!r}.",
                            id="django_delayq.E007"))
    shards = conf.raw("SHARDS")
    if not isinstance(shards, dict) or any(
        not isinstance(k, str) or not QUEUE_NAME_RE.match(k) or isinstance(v, bool)
        or not isinstance(v, int) or not 1 <= v <= 1024
        for k, v in shards.items()
    ):
        errors.append(Error("DELAYQ['SHARDS'] must map queue names to shard counts (1-1024), "
                            f"not {shards!r}.", id="django_delayq.E021"))
    errors += _check_flow_control()
    return errors


def _check_flow_control() -> list[CheckMessage]:
    """QUEUES (E023), CLUSTER (E024) and the periodic-task settings (E025-E027)."""
    errors: list[CheckMessage] = []
    queues = conf.raw("QUEUES")
    if not isinstance(queues, dict):
        errors.append(Error(f"DELAYQ['QUEUES'] must be a dict of queue name -> options, not "
                            f"{queues!r}.", id="django_delayq.E023"))
        queues = {}
    for name, spec in queues.items():
        if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
            errors.append(Error(f"DELAYQ['QUEUES'] has an invalid queue name {name!r}.",
                                id="django_delayq.E023"))
            continue
        try:
            queue_options(spec)
        except ValueError as exc:
            errors.append(Error(f"DELAYQ['QUEUES'][{name!r}]: {exc}.",
                                hint="e.g. {'rate_limit': '100/m'} or {'interval': 0.5, "
                                     "'shards': 4}", id="django_delayq.E023"))
    if not isinstance(conf.raw("CLUSTER"), bool):
        errors.append(Error(f"DELAYQ['CLUSTER'] must be True or False, not "
                            f"{conf.raw('CLUSTER')!r}.", id="django_delayq.E024"))
    errors += _number("CRON_LOOKAHEAD", minimum=1)
    if conf.raw("CRON_MISSED") not in ("latest", "all", "skip"):
        errors.append(Error(f"DELAYQ['CRON_MISSED'] must be 'latest', 'all' or 'skip', not "
                            f"{conf.raw('CRON_MISSED')!r}.", id="django_delayq.E026"))
    errors += _number("CRON_CATCH_UP_MAX", minimum=1, integer=True)
    return errors


@register(Tags.compatibility)
def check_api_permission_classes(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """API_PERMISSION_CLASSES: a list of importable dotted paths (imported only if set)."""
    if not isinstance(getattr(settings, "DELAYQ", None), dict):
        return []  # E001
    value = conf.raw("API_PERMISSION_CLASSES")
    if value is DEFAULTS["API_PERMISSION_CLASSES"]:
        return []  # the default needs DRF, which only the API (an extra) uses
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        return [Error("DELAYQ['API_PERMISSION_CLASSES'] must be a list of dotted paths to "
                      f"permission classes, not {value!r}.", id="django_delayq.E040")]
    errors: list[CheckMessage] = []
    for path in value:
        try:
            import_string(path)
        except ImportError as exc:
            errors.append(Error(f"DELAYQ['API_PERMISSION_CLASSES'] names {path!r}, which "
                                f"cannot be imported: {exc}", id="django_delayq.E040"))
    return errors


SPARK_MASTER_RE = re.compile(
    r"^(local(\[(\*|[1-9][0-9]*)(,[0-9]+)?\])?|local-cluster\[[0-9, ]+\]|yarn"
    r"|(spark|mesos|k8s)://\S+)$"
)


@register(Tags.compatibility)
def check_spark_master(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """``DELAYQ['SPARK_MASTER']`` must be a master URL Spark understands."""
    if not isinstance(getattr(settings, "DELAYQ", None), dict):
        return []
    master = conf.raw("SPARK_MASTER")
    if not isinstance(master, str) or not SPARK_MASTER_RE.match(master):
        return [Error(f"DELAYQ['SPARK_MASTER'] must be a Spark master URL such as local[*], "
                      f"local[4], spark://host:7077, yarn or k8s://https://host:443, "
                      f"not {master!r}.", id="django_delayq.E060")]
    return []


#: Keys other modules of django-delayq read from DELAYQ (validated by their own checks).
_EXTENSION_KEYS: set[str] = set()
