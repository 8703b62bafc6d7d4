"""Settings of django-delayq, read from ``settings.DELAYQ`` on every access.

One table, the body of :class:`DelayQSettings`, defines each setting once: its default,
the converter of its typed accessor, its system check and check id, and what it means.
The checks (:mod:`django_delayq.checks`) and the defaults are both read from that table.
Reading on access (not at import) keeps ``override_settings`` working in tests; the
``DELAYQ`` dict itself is kept between accesses until Django says it changed
(``setting_changed``), as looking it up on ``settings`` is most of an access's cost.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Generic, TypeVar, overload

from django.conf import settings
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .engine.keys import QUEUE_NAME_RE
from .engine.limits import queue_options
from .engine.urls import SENTINEL_SCHEMES, check_url, redact

T = TypeVar("T")

#: A check of one setting's given value: the problems found, each a sentence.
Check = Callable[[Any], list[str]]

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


class Setting(Generic[T]):
    """One row of the settings table; as a class attribute, the setting's typed value."""

    name: str

    def __init__(self, default: Any, convert: Callable[[Any], T], check_id: str,
                 check: Check, doc: str, *, hint: str | None = None) -> None:
        self.default = default
        self.convert = convert
        self.check_id = f"django_delayq.{check_id}"
        self.check = check
        self.doc = doc
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


# -- converters ------------------------------------------------------------------------

def optional(convert: Callable[[Any], T]) -> Callable[[Any], T | None]:
    return lambda value: None if value is None else convert(value)


def str_list(value: Any) -> list[str]:
    return [str(item) for item in value]


# -- checks ----------------------------------------------------------------------------

def number(*, minimum: float, integer: bool = False, allow_none: bool = False) -> Check:
    """A number (an int when ``integer``) of at least ``minimum``; never a bool."""
    kind = int if integer else (int, float)
    what = "an int" if integer else "a number"

    def check(value: Any) -> list[str]:
        if value is None and allow_none:
            return []
        if isinstance(value, bool) or not isinstance(value, kind) or value < minimum:
            return [f"must be {what} >= {minimum}, not {value!r}."]
        return []

    return check


def _redis_url(value: Any) -> list[str]:
    problem = check_url(value)
    if problem is not None:
        # The URL may hold passwords: the message shows it without them.
        return [f"{redact(value)!r} is not a usable Redis URL: {problem}."]
    return []


def _cluster(value: Any) -> list[str]:
    problems = _boolean(value)
    url = given().get("REDIS_URL")
    if value is True and isinstance(url, str) and url.partition("://")[0] in SENTINEL_SCHEMES:
        problems.append("is True while REDIS_URL is a Sentinel URL: Sentinel serves one "
                        "primary and its replicas, not a Cluster. Set CLUSTER to False for "
                        "Sentinel, or name the Cluster's nodes in a redis+cluster:// URL.")
    return problems


def _cache_alias(value: Any) -> list[str]:
    if value is not None and value not in getattr(settings, "CACHES", {}):
        return [f"{value!r} is not in settings.CACHES."]
    return []


def _prefix(value: Any) -> list[str]:
    if not isinstance(value, str) or not QUEUE_NAME_RE.match(value):
        return [f"must be 1-64 characters from A-Z a-z 0-9 _ . -, not {value!r}."]
    return []


def _queue_name(value: Any) -> list[str]:
    if not isinstance(value, str) or not QUEUE_NAME_RE.match(value):
        return [f"is not a valid queue name: {value!r}."]
    return []


def _shards(value: Any) -> list[str]:
    if not isinstance(value, dict) or any(
        not isinstance(k, str) or not QUEUE_NAME_RE.match(k) or isinstance(v, bool)
        or not isinstance(v, int) or not 1 <= v <= 1024
        for k, v in value.items()
    ):
        return [f"must map queue names to shard counts (1-1024), not {value!r}."]
    return []


def _queues(value: Any) -> list[str]:
    if not isinstance(value, dict):
        return [f"must be a dict of queue name -> options, not {value!r}."]
    problems = []
    for name, spec in value.items():
        if not isinstance(name, str) or not QUEUE_NAME_RE.match(name):
            problems.append(f"has an invalid queue name {name!r}.")
            continue
        try:
            queue_options(spec)
        except ValueError as exc:
            problems.append(f"[{name!r}]: {exc}.")
    return problems


def _boolean(value: Any) -> list[str]:
    return [] if isinstance(value, bool) else [f"must be True or False, not {value!r}."]


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
        problems += [f"[{key!r}] {p}" for p in _boolean(options[key])]
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
    if given().get("EVENTS_MAXLEN", 100_000) == 0:
        return ["is set while EVENTS_MAXLEN is 0: no events are recorded to export."]
    return []


def _spark_master(value: Any) -> list[str]:
    if not isinstance(value, str) or not SPARK_MASTER_RE.match(value):
        return [f"must be a Spark master URL such as local[*], local[4], spark://host:7077, "
                f"yarn or k8s://https://host:443, not {redact(value)!r}."]
    return []


class DelayQSettings:
    """``settings.DELAYQ`` with defaults: the table of every setting, one row each."""

    # Connection: a Redis URL (redis://, rediss:// for TLS, unix://), or a django-redis
    # cache alias whose connection settings are reused.
    REDIS_URL = Setting("redis://127.0.0.1:6379/0", str, "E002", _redis_url,
                        "Redis URL: redis://, rediss:// (TLS), unix://, redis+sentinel:// "
                        "or redis+cluster:// (docs/high-availability.md).", hint=URL_HINT)
    CACHE_ALIAS = Setting(None, optional(str), "E003", _cache_alias,
                          "A django-redis cache alias whose connection is reused.")
    SOCKET_TIMEOUT = Setting(5.0, float, "E004", number(minimum=0.1),
                             "Seconds a Redis command may take before enqueue raises "
                             "DelayQConnectionError.")
    SOCKET_CONNECT_TIMEOUT = Setting(2.0, float, "E005", number(minimum=0.1),
                                     "Seconds a connection to Redis may take.")
    PREFIX = Setting("dq", str, "E006", _prefix,
                     "Prefix of every Redis key (inside the hash tag: {prefix:queue}).")
    DEFAULT_QUEUE = Setting("default", str, "E007", _queue_name,
                            "Queue of tasks that name none.")
    # By default Django's model permissions of django_delayq.Job: view_job reads,
    # add_job enqueues, change_job does every other write.
    API_PERMISSION_CLASSES = Setting(["django_delayq.api.permissions.JobModelPermissions"],
                                     str_list, "E040", _permission_classes,
                                     "Permission classes (dotted paths) of the REST API.")
    # Attempts per job (the first run included) and the retry backoff, in seconds:
    # min(RETRY_BACKOFF_MAX, RETRY_BACKOFF * 2 ** (attempt - 1)), jittered down to half.
    MAX_ATTEMPTS = Setting(3, int, "E008", number(minimum=1, integer=True),
                           "Attempts per job, the first run included.")
    RETRY_BACKOFF = Setting(2.0, float, "E009", number(minimum=0),
                            "Seconds of the first retry's backoff, doubled per attempt.")
    RETRY_BACKOFF_MAX = Setting(600.0, float, "E010", number(minimum=0),
                                "Most seconds of one retry's backoff.")
    LEASE = Setting(30.0, float, "E011", number(minimum=0.1),
                    "Seconds a claimed job stays leased; the heartbeat renews running jobs.")
    CONCURRENCY = Setting(4, int, "E012", number(minimum=1, integer=True),
                          "Jobs a worker runs at once.")
    GRACE_PERIOD = Setting(30.0, float, "E013", number(minimum=0),
                           "Seconds a stopping worker waits for its running jobs.")
    BLOCK_TIMEOUT = Setting(2.0, float, "E014", number(minimum=0.1),
                            "Seconds an idle worker blocks waiting for a job.")
    # The process pool (runworker --processes, docs/pool.md): worker processes (1: no
    # pool), and the limits after which a worker process is replaced by a fresh one.
    PROCESSES = Setting(1, int, "E080", number(minimum=1, integer=True),
                        "Worker processes of runworker (above 1: a supervised pool).")
    MAX_JOBS_PER_CHILD = Setting(None, optional(int), "E081",
                                 number(minimum=1, integer=True, allow_none=True),
                                 "Jobs after which a worker process is replaced (None: "
                                 "no limit).")
    MAX_MEMORY_PER_CHILD = Setting(None, optional(float), "E082",
                                   number(minimum=1, allow_none=True),
                                   "MiB of resident memory at which a worker process is "
                                   "replaced (None: no limit).")
    # async def tasks (docs/async.md): how many run at once per worker process, on its
    # event loop thread.
    ASYNC_CONCURRENCY = Setting(10, int, "E083", number(minimum=1, integer=True),
                                "async def jobs run at once per worker process.")
    # Time limit of each attempt of a job whose task sets none, in seconds (None: no
    # limit, as for a plain function call; see docs/guarantees.md, "Time limits").
    TIMEOUT = Setting(None, optional(float), "E084", number(minimum=0.001, allow_none=True),
                      "Seconds each attempt of a job may run (None: no limit).")
    # Retention in Redis, in seconds and counts.
    RESULT_TTL = Setting(86_400, float, "E015", number(minimum=0),
                         "Seconds a completed job's data stays in Redis.")
    FAILED_TTL = Setting(7 * 86_400, float, "E016", number(minimum=0),
                         "Seconds a failed job's data stays in Redis.")
    KEEP_COMPLETED = Setting(10_000, int, "E017", number(minimum=0, integer=True),
                             "Completed job ids kept per queue.")
    KEEP_FAILED = Setting(100_000, int, "E018", number(minimum=0, integer=True),
                          "Failed job ids kept per queue.")
    EVENTS_MAXLEN = Setting(100_000, int, "E019", number(minimum=0, integer=True),
                            "Approximate length of each queue's event stream.")
    MAX_PAYLOAD_BYTES = Setting(1_048_576, int, "E020", number(minimum=0, integer=True),
                                "Largest encoded arguments accepted at enqueue, in bytes "
                                "(0: no limit).")
    SHARDS = Setting({}, dict, "E021", _shards,
                     "Shards per queue name, e.g. {'emails': 4}.")
    # Flow control per queue name: {"emails": {"rate_limit": "100/m"},
    # "api": {"interval": 0.5, "shards": 4}} (see docs/flow-control.md). "shards" here
    # takes precedence over SHARDS.
    QUEUES = Setting({}, dict, "E023", _queues,
                     "Flow control per queue name (rate_limit, interval, shards).",
                     hint="e.g. {'rate_limit': '100/m'} or {'interval': 0.5, 'shards': 4}")
    CLUSTER = Setting(False, bool, "E024", _cluster,
                      "True when REDIS_URL names one node of a Redis Cluster.")
    # High availability (docs/high-availability.md, docs/guarantees.md "Failover").
    MIN_REPLICAS = Setting(0, int, "E070", number(minimum=0, integer=True),
                           "Replicas that must confirm each enqueue (Redis WAIT, in the "
                           "same round trip) before it returns.")
    MIN_REPLICAS_TIMEOUT = Setting(1.0, float, "E071", number(minimum=0.001),
                                   "Seconds an enqueue waits for MIN_REPLICAS replicas; "
                                   "then NotReplicated is raised.")
    MIN_REPLICAS_ACKS = Setting(False, bool, "E072", _boolean,
                                "Whether worker acks wait for MIN_REPLICAS replicas too.")
    FAILOVER_RETRY = Setting(0.0, float, "E073", number(minimum=0),
                             "Seconds an enqueue keeps retrying through a failover, with "
                             "the same job id (a retry cannot add it twice).")
    # Seconds ahead a worker enqueues the next occurrences of periodic tasks, and what
    # happens to occurrences missed while no worker ran: "latest" (run the most recent
    # one once), "all" (run each, at most CRON_CATCH_UP_MAX) or "skip".
    CRON_LOOKAHEAD = Setting(30.0, float, "E025", number(minimum=1),
                             "Seconds ahead a worker enqueues periodic tasks.")
    CRON_MISSED = Setting("latest", str, "E026", _cron_missed,
                          "Missed periodic occurrences: 'latest', 'all' or 'skip'.")
    CRON_CATCH_UP_MAX = Setting(100, int, "E027", number(minimum=1, integer=True),
                                "Most missed occurrences run when CRON_MISSED is 'all'.")
    # The model mirror: seconds finished rows are kept in the database (None: forever),
    # events read per batch, and seconds another mirror's unacknowledged events may sit
    # before this one takes them over.
    MIRROR_RETENTION = Setting(30 * 86_400, optional(float), "E030",
                               number(minimum=0, allow_none=True),
                               "Seconds finished rows stay in the database (None: forever).")
    MIRROR_BATCH_SIZE = Setting(1_000, int, "E031", number(minimum=1, integer=True),
                                "Events the mirror reads per batch.")
    MIRROR_CLAIM_IDLE = Setting(60.0, float, "E032", number(minimum=0),
                                "Seconds another mirror's unacknowledged events may sit "
                                "before this one takes them over.")
    # The job-history lake: a local path or filesystem URL (s3://, gs://, hdfs://...)
    # that an export thread appends every queue's events to: one per runworker (or
    # pool), in its mirror process or, without one, in runworker itself; delayq_mirror
    # runs one too (None: off; the delayq_export command takes the path itself).
    LAKE_PATH = Setting(None, optional(str), "E033", _lake_path,
                        "Where the export thread of runworker (its mirror process, or "
                        "runworker itself under --no-mirror) and delayq_mirror writes "
                        "the job-history lake (None: no thread).")
    # The transactional outbox (Task.enqueue_in_transaction): keys left out keep their
    # defaults (OUTBOX_DEFAULTS).
    OUTBOX = Setting(OUTBOX_DEFAULTS, _outbox_options, "E090", _outbox,
                     "Options of the transactional outbox: RELAY, FAST_PATH, CHUNK_SIZE, "
                     "POLL_INTERVAL, DATABASES.")
    # Spark master URL of the Spark pipeline's commands; --master overrides it.
    SPARK_MASTER = Setting("local[*]", str, "E060", _spark_master,
                           "Spark master URL (local[*], spark://host:7077, yarn, k8s://...).")
    # Tests: run each job in the enqueuing process at enqueue time, with the same checks
    # and JSON round trip as a worker, and nothing sent to Redis. True records a failure
    # on the returned job; "propagate" also raises it (see docs/testing.md).
    EAGER = Setting(False, _eager, "E028", _eager_check,
                    "Run jobs at enqueue in the same process (tests): True or 'propagate'.")


#: Every setting by name, in the table's order.
SETTINGS: dict[str, Setting[Any]] = {
    name: row for name, row in vars(DelayQSettings).items() if isinstance(row, Setting)
}
#: The default of every setting.
DEFAULTS: dict[str, Any] = {name: row.default for name, row in SETTINGS.items()}

conf = DelayQSettings()
