"""Settings of django-delayq, read from ``settings.DELAYQ`` on every access.

One table, the body of :class:`DelayQSettings`, defines each setting once: its default
and unit, the converter of its typed accessor, its system check and check id, and its
row of the docs' settings table (the README's table is this one, tested). The settings
the engine reads are defined with the engine's fields (:mod:`django_delayq.engine.config`,
which has no Django): their rows here are :class:`EngineSetting`, which add the check id
only, and :func:`django_delayq.connection.engine_config` builds the engine's config from
them. The checks (:mod:`django_delayq.checks`) and the defaults are read from the table.

Reading on access (not at import) keeps ``override_settings`` working in tests; the
``DELAYQ`` dict itself is kept between accesses until Django says it changed
(``setting_changed``), as looking it up on ``settings`` is most of an access's cost.

Each thing has one way to be said: :data:`REPLACED` lists the settings that were a second
way (``SHARDS``, ``CLUSTER``), each with the message that says what to write instead.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from django.conf import settings
from django.core.signals import setting_changed
from django.utils import timezone
from django.utils.module_loading import import_string

from .engine.config import OPTIONS, Check, boolean, number
from .engine.keys import QUEUE_NAME_RE
from .engine.urls import check_url, redact

T = TypeVar("T")

URL_HINT = ("One server: redis://[:password@]host:6379/0 (rediss:// for TLS, unix:///path). "
            "A Cluster: redis+cluster://h1:p1,h2:p2,h3:p3/0. Sentinel: "
            "redis+sentinel://[:password@]h1:26379,h2:26379/service/0?sentinel_password=...")
SPARK_MASTER_RE = re.compile(
    r"^(local(\[(\*|[1-9][0-9]*)(,[0-9]+)?\])?|local-cluster\[[0-9, ]+\]|yarn"
    r"|(spark|mesos|k8s)://\S+)$"
)


_given: dict[str, Any] | None = None
#: Typed values already converted from ``_given``, by setting name.
_typed: dict[str, Any] = {}


def given() -> dict[str, Any]:
    """``settings.DELAYQ`` as the user wrote it (empty when unset)."""
    global _given
    if _given is None:
        _given = getattr(settings, "DELAYQ", None) or {}
    return _given


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    global _given
    if setting == "DELAYQ":
        _given = None
        _typed.clear()


setting_changed.connect(_on_setting_changed, dispatch_uid="django_delayq.conf")


def django_time(value: dt.datetime | None) -> dt.datetime | None:
    """A time (aware, as the engine reads one) as Django stores and gives one: aware with
    ``USE_TZ``, else naive in ``TIME_ZONE``, which is all SQLite and MySQL take then."""
    if value is None or settings.USE_TZ or timezone.is_naive(value):
        return value
    return timezone.make_naive(value, timezone.get_default_timezone())


def aware_time(value: dt.datetime | None) -> dt.datetime | None:
    """A time as Django keeps it (:func:`django_time`) as an aware one: a naive time is
    in ``TIME_ZONE``, whatever zone a request activated."""
    if value is None or timezone.is_aware(value):
        return value
    return timezone.make_aware(value, timezone.get_default_timezone())


class Setting(Generic[T]):
    """One row of the settings table; as a class attribute, the setting's typed value."""

    name: str

    def __init__(self, default: Any, convert: Callable[[Any], T], check_id: str,
                 check: Check, doc: str, *, unit: str = "", hint: str | None = None) -> None:
        self.default = default
        self.convert = convert
        self.check_id = f"django_delayq.{check_id}"
        self.check = check
        self.doc = doc
        self.unit = unit
        self.hint = hint

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def value(self) -> Any:
        """The setting as given, or its default (unconverted, for the checks)."""
        return given().get(self.name, self.default)

    @overload
    def __get__(self, obj: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> T: ...

    def __get__(self, obj: object | None, owner: type) -> Setting[T] | T:
        if obj is None:
            return self
        try:
            return _typed[self.name]
        except KeyError:
            value = _typed[self.name] = self.convert(self.value())
            return value


class EngineSetting(Setting[T]):
    """A row the engine defines (default, unit, check, doc: see
    :mod:`django_delayq.engine.config`); this table gives it a check id."""

    def __init__(self, check_id: str, *, hint: str | None = None) -> None:
        self.check_id = f"django_delayq.{check_id}"
        self.hint = hint

    def __set_name__(self, owner: type, name: str) -> None:
        row = OPTIONS[name][0]
        self.name, self.default, self.check, self.doc = name, row.default, row.check, row.doc
        self.convert, self.unit = row.convert, row.unit


# -- converters ------------------------------------------------------------------------

def optional(convert: Callable[[Any], T]) -> Callable[[Any], T | None]:
    return lambda value: None if value is None else convert(value)


def str_list(value: Any) -> list[str]:
    return [str(item) for item in value]


# -- checks ----------------------------------------------------------------------------

def _redis_url(value: Any) -> list[str]:
    problem = check_url(value)
    if problem is not None:
        # The URL may hold passwords: the message shows it without them.
        return [f"{redact(value)!r} is not a usable Redis URL: {problem}."]
    return []


def _cache_alias(value: Any) -> list[str]:
    if value is not None and value not in getattr(settings, "CACHES", {}):
        return [f"{value!r} is not in settings.CACHES."]
    return []


def _queue_name(value: Any) -> list[str]:
    if not isinstance(value, str) or not QUEUE_NAME_RE.match(value):
        return [f"is not a valid queue name: {value!r}."]
    return []


def _cron_missed(value: Any) -> list[str]:
    if value not in ("latest", "all", "skip"):
        return [f"must be 'latest', 'all' or 'skip', not {value!r}."]
    return []


def _eager(value: Any) -> bool | str:
    return value if value == "propagate" else bool(value)


def _eager_check(value: Any) -> list[str]:
    if value not in (True, False, "propagate"):
        return [f"must be True, False or 'propagate', not {value!r}."]
    return []


def _permission_classes(value: Any) -> list[str]:
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) for p in value):
        return [f"must be a list of dotted paths to permission classes, not {value!r}."]
    problems = []
    for path in value:
        try:
            import_string(path)
        except ImportError as exc:
            problems.append(f"names {path!r}, which cannot be imported: {exc}")
    return problems


#: The options of DELAYQ["OUTBOX"] (the transactional outbox, docs/outbox.md).
OUTBOX_DEFAULTS: dict[str, Any] = {
    "RELAY": True,  # run the relay on a thread: one per runworker (or pool), delayq_mirror
    "FAST_PATH": True,  # send a transaction's jobs from an on_commit hook at once
    "CHUNK_SIZE": 500,  # rows the relay (and the commit hook) send per round trip
    "POLL_INTERVAL": 1.0,  # seconds the relay waits between reads of an empty outbox
    "DATABASES": ["default"],  # database aliases the relay thread reads
}


def _outbox_options(value: Any) -> dict[str, Any]:
    """The outbox options given, the defaults filled in for keys left out."""
    return {**OUTBOX_DEFAULTS, **(value if isinstance(value, dict) else {})}


def _outbox(value: Any) -> list[str]:
    if not isinstance(value, dict):
        return [f"must be a dict of options, not {value!r}."]
    problems = []
    unknown = sorted(str(key) for key in set(value) - set(OUTBOX_DEFAULTS))
    if unknown:
        problems.append(f"has unknown keys: {', '.join(unknown)} (known: "
                        f"{', '.join(sorted(OUTBOX_DEFAULTS))}).")
    options = _outbox_options(value)
    for key in ("RELAY", "FAST_PATH"):
        problems += [f"[{key!r}] {p}" for p in boolean(options[key])]
    problems += [f"['CHUNK_SIZE'] {p}"
                 for p in number(minimum=1, integer=True)(options["CHUNK_SIZE"])]
    poll = options["POLL_INTERVAL"]
    if isinstance(poll, bool) or not isinstance(poll, int | float) or not 0.01 <= poll <= 3600:
        problems.append(f"['POLL_INTERVAL'] must be seconds from 0.01 to 3600, not {poll!r}.")
    aliases = options["DATABASES"]
    if not isinstance(aliases, list | tuple) or not all(
            isinstance(a, str) and a in settings.DATABASES for a in aliases):
        problems.append(f"['DATABASES'] must be a list of aliases of settings.DATABASES, "
                        f"not {aliases!r}.")
    return problems


def _lake_path(value: Any) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, str) or not value.strip():
        return [f"must be a path or a filesystem URL (or None), not {value!r}."]
    from .lake.store import open_lake  # PyArrow: only when a lake is configured

    try:
        open_lake(value)
    except (ValueError, ImportError) as exc:
        return [str(exc)]
    if DelayQSettings.EVENTS_MAXLEN.value() == 0:
        return ["is set while EVENTS_MAXLEN is 0: no events are recorded to export."]
    return []


def _spark_master(value: Any) -> list[str]:
    if not isinstance(value, str) or not SPARK_MASTER_RE.match(value):
        return [f"must be a Spark master URL such as local[*], local[4], spark://host:7077, "
                f"yarn or k8s://https://host:443, not {redact(value)!r}."]
    return []




# -- settings that were a second way to say something ---------------------------------

def _shards_moved(user: dict[str, Any]) -> str:
    value, given_queues = user["SHARDS"], user.get("QUEUES")
    queues = {name: dict(spec) for name, spec in (
        given_queues.items() if isinstance(given_queues, dict) else ()) if isinstance(spec, dict)}
    for name, count in (value.items() if isinstance(value, dict) else ()):
        queues.setdefault(name, {}).setdefault("shards", count)  # QUEUES' own shards won
    if not queues:
        return "is no longer read: shards are set per queue in QUEUES. Delete SHARDS."
    return (f"is no longer read: shards are set per queue in QUEUES, with the queue's other "
            f"options. Write \"QUEUES\": {queues!r} and delete SHARDS.")


def _cluster_moved(user: dict[str, Any]) -> str:
    url = user.get("REDIS_URL", DelayQSettings.REDIS_URL.default)
    scheme = url.partition("://")[0] if isinstance(url, str) else ""
    if user["CLUSTER"] is True and scheme in ("redis", "rediss"):
        shown = redact(url).replace("://", "+cluster://", 1)
        note = " (your password where *** stands)" if "***" in shown else ""
        return (f"is no longer read: a Cluster is named by its URL. Write \"REDIS_URL\": "
                f"{shown!r}{note} and delete CLUSTER.")
    return ("is no longer read: a Cluster is named by a redis+cluster://h1:p1,h2:p2/0 "
            "REDIS_URL. Delete CLUSTER.")


#: Settings that said again what another says; each with its check id and the message
#: (from every setting given) that says exactly what to write instead: a check error,
#: and refused when the engine's config is built.
REPLACED: dict[str, tuple[str, Callable[[dict[str, Any]], str]]] = {
    "SHARDS": ("django_delayq.E021", _shards_moved),
    "CLUSTER": ("django_delayq.E024", _cluster_moved),
}


def replaced(user: dict[str, Any]) -> list[tuple[str, str, str]]:
    """The replaced settings in ``user``: (name, check id, the problem with its fix)."""
    return [(name, check_id, f"DELAYQ[{name!r}] {message(user)}")
            for name, (check_id, message) in REPLACED.items() if name in user]


class DelayQSettings:
    """``settings.DELAYQ`` with defaults: the table of every setting, one row each."""

    REDIS_URL = Setting("redis://127.0.0.1:6379/0", str, "E002", _redis_url,
                        "`redis://`, `rediss://` (TLS), `unix://`, "
                        "`redis+sentinel://h1:26379,h2:26379/service/0`, or "
                        "`redis+cluster://h1:7000,h2:7000/0` "
                        "([high availability](docs/high-availability.md))", hint=URL_HINT)
    CACHE_ALIAS = Setting(None, optional(str), "E003", _cache_alias,
                          "reuse a django-redis cache's connection settings instead")
    SOCKET_TIMEOUT = Setting(5.0, float, "E004", number(minimum=0.1),
                             "how long a Redis command may take before "
                             "`DelayQConnectionError`", unit="seconds")
    SOCKET_CONNECT_TIMEOUT = Setting(2.0, float, "E005", number(minimum=0.1),
                                     "how long a connection to Redis may take",
                                     unit="seconds")
    PREFIX: EngineSetting[str] = EngineSetting("E006")
    DEFAULT_QUEUE = Setting("default", str, "E007", _queue_name,
                            "queue of tasks that name none")
    API_PERMISSION_CLASSES = Setting(["django_delayq.api.permissions.JobModelPermissions"],
                                     str_list, "E040", _permission_classes,
                                     "permission classes of the REST API (dotted paths); the "
                                     "default needs `view_job` to read, `add_job` to enqueue, "
                                     "`change_job` for other writes")
    API_ANY_QUEUE = Setting(False, bool, "E140", boolean,
                            "whether the API's enqueue takes any queue name; `False`: only "
                            "the declared queues (`QUEUES`, `DEFAULT_QUEUE` and those of "
                            "registered tasks), others answer 400")
    MAX_ATTEMPTS = Setting(3, int, "E008", number(minimum=1, integer=True),
                           "attempts per job, the first run included", unit="runs")
    # A retry waits min(RETRY_BACKOFF_MAX, RETRY_BACKOFF * 2 ** (attempt - 1)), jittered
    # down to half.
    RETRY_BACKOFF = Setting(2.0, float, "E009", number(minimum=0),
                            "the first retry's backoff, doubled per attempt", unit="seconds")
    RETRY_BACKOFF_MAX = Setting(600.0, float, "E010", number(minimum=0),
                                "the longest backoff of one retry", unit="seconds")
    LEASE: EngineSetting[float] = EngineSetting("E011")
    CONCURRENCY = Setting(4, int, "E012", number(minimum=1, integer=True),
                          "jobs a worker process runs at once", unit="threads")
    GRACE_PERIOD = Setting(30.0, float, "E013", number(minimum=0),
                           "how long running jobs get to finish after a stop signal",
                           unit="seconds")
    BLOCK_TIMEOUT = Setting(2.0, float, "E014", number(minimum=0.1),
                            "longest idle block on Redis", unit="seconds")
    PROCESSES = Setting(1, int, "E080", number(minimum=1, integer=True),
                        "worker processes of `runworker`, each watched by its host process "
                        "([the pool](docs/pool.md))", unit="processes")
    MAX_PROCESSES = Setting(None, optional(int), "E088",
                            number(minimum=1, integer=True, allow_none=True),
                            "most worker processes `runworker` starts (`None`: 4 per CPU, "
                            "at least 8); a larger `--processes` is refused",
                            unit="processes")
    MAX_CONCURRENCY = Setting(1000, int, "E089", number(minimum=1, integer=True),
                              "most threads (and `async def` slots) per worker process; a "
                              "larger `--concurrency` is refused", unit="jobs")
    MAX_JOBS_PER_CHILD = Setting(None, optional(int), "E081",
                                 number(minimum=1, integer=True, allow_none=True),
                                 "replace a worker process after about this many jobs "
                                 "(`None`: never)", unit="jobs")
    MAX_MEMORY_PER_CHILD = Setting(None, optional(float), "E082",
                                   number(minimum=1, allow_none=True),
                                   "replace a worker process once its resident memory "
                                   "reaches this (`None`: never)", unit="MiB")
    ASYNC_CONCURRENCY = Setting(10, int, "E083", number(minimum=1, integer=True),
                                "`async def` jobs run at once per worker process, on its "
                                "event loop ([async tasks](docs/async.md))", unit="jobs")
    TIMEOUT = Setting(None, optional(float), "E084", number(minimum=0.001, allow_none=True),
                      "time limit of each attempt of a job whose task sets none (`None`: "
                      "no limit; [time limits](docs/guarantees.md#time-limits))",
                      unit="seconds")
    RESULT_TTL: EngineSetting[float] = EngineSetting("E015")
    FAILED_TTL: EngineSetting[float] = EngineSetting("E016")
    KEEP_COMPLETED: EngineSetting[int] = EngineSetting("E017")
    KEEP_FAILED: EngineSetting[int] = EngineSetting("E018")
    EVENTS_MAXLEN: EngineSetting[int] = EngineSetting("E019")
    EVENTS_MAX_BYTES: EngineSetting[int] = EngineSetting("E131")
    ERROR_MAX_BYTES: EngineSetting[int] = EngineSetting("E132")
    PROGRESS_MAX_BYTES: EngineSetting[int] = EngineSetting("E133")
    MAX_PAYLOAD_BYTES: EngineSetting[int] = EngineSetting("E020")
    RESULT_MAX_BYTES: EngineSetting[int] = EngineSetting("E130")
    QUEUES: EngineSetting[dict[str, Any]] = EngineSetting(
        "E023", hint="e.g. {'rate_limit': '100/m'} or {'interval': 0.5, 'shards': 4}")
    MIN_REPLICAS: EngineSetting[int] = EngineSetting("E070")
    MIN_REPLICAS_TIMEOUT: EngineSetting[float] = EngineSetting("E071")
    MIN_REPLICAS_ACKS: EngineSetting[bool] = EngineSetting("E072")
    FAILOVER_RETRY: EngineSetting[float] = EngineSetting("E073")
    CRON_LOOKAHEAD = Setting(30.0, float, "E025", number(minimum=1),
                             "how far ahead workers enqueue periodic tasks' occurrences",
                             unit="seconds")
    CRON_MISSED = Setting("latest", str, "E026", _cron_missed,
                          "what runs of the occurrences missed while no worker ran: "
                          "`\"latest\"` (the most recent, once), `\"all\"` or `\"skip\"`")
    CRON_CATCH_UP_MAX = Setting(100, int, "E027", number(minimum=1, integer=True),
                                "most missed occurrences run when `CRON_MISSED` is `\"all\"`",
                                unit="runs")
    MIRROR_RETENTION = Setting(30 * 86_400, optional(float), "E030",
                               number(minimum=0, allow_none=True),
                               "how long finished job rows, and rows of jobs gone from Redis, "
                               "are kept in the database (`None`: forever)", unit="seconds")
    MIRROR_BATCH_SIZE = Setting(1_000, int, "E031", number(minimum=1, integer=True),
                                "events the mirror reads per batch", unit="events")
    MIRROR_CLAIM_IDLE = Setting(60.0, float, "E032", number(minimum=0),
                                "how long another mirror's unacknowledged events may sit "
                                "before this one takes them over", unit="seconds")
    OUTBOX = Setting(OUTBOX_DEFAULTS, _outbox_options, "E090", _outbox,
                     "the transactional outbox: relay thread on/off, commit hook on/off, "
                     "chunk size, poll interval, databases; keys left out keep their "
                     "defaults ([outbox](docs/outbox.md#settings))")
    LAKE_PATH = Setting(None, optional(str), "E033", _lake_path,
                        "a path or filesystem URL: `runworker` then exports every queue's "
                        "events to the job-history lake on a thread of its host process, as "
                        "`delayq_mirror` does (`None`: no thread; [lake](docs/lake.md))")
    SPARK_MASTER = Setting("local[*]", str, "E060", _spark_master,
                           "Spark master URL of `delayq_spark_enqueue` and `delayq_report` "
                           "(`--master` overrides it)")
    EAGER = Setting(False, _eager, "E028", _eager_check,
                    "tests: run jobs at enqueue in the same process, with the same checks "
                    "and JSON round trip as a worker, nothing sent to Redis (`\"propagate\"` "
                    "also raises a task's error; [testing](docs/testing.md))")


#: Every setting by name, in the table's order.
SETTINGS: dict[str, Setting[Any]] = {
    name: row for name, row in vars(DelayQSettings).items() if isinstance(row, Setting)
}

conf = DelayQSettings()
