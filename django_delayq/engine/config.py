"""The engine's configuration, and the one definition of each setting the engine reads.

Each field of :class:`EngineConfig` that users set is one row of the settings table,
declared with the field by :func:`option`: the name users write in ``settings.DELAYQ``,
the default and unit they write it in, its check and its doc row. The field's own default
is derived from that row (seconds become milliseconds), so the engine used bare (Spark
executors, benchmarks, tests: ``EngineConfig(...)``) has the same defaults as Django.

The Django layer (:mod:`django_delayq.conf`) takes these rows into its table as they
are, adding only their system check ids, and builds the config with
:meth:`EngineConfig.from_settings`, which reads every row the same way: no field is
mapped by hand. Spark's driver ships the config it built to the executors whole.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .keys import QUEUE_NAME_RE
from .limits import RateLimit, queue_options

#: A check of one setting's given value: the problems found, each a sentence.
Check = Callable[[Any], list[str]]


def number(*, minimum: float, integer: bool = False, allow_none: bool = False) -> Check:
    """A number (an int when ``integer``) of at least ``minimum``; never a bool."""
    kind = int if integer else (int, float)
    what = "an int" if integer else "a number"

    def check(value: Any) -> list[str]:
        if value is None and allow_none:
            return []
        if (isinstance(value, bool) or not isinstance(value, kind) or value < minimum
                or not math.isfinite(value)):
            return [f"must be {what} >= {minimum}, not {value!r}."]
        return []

    return check


def boolean(value: Any) -> list[str]:
    return [] if isinstance(value, bool) else [f"must be True or False, not {value!r}."]


def _prefix(value: Any) -> list[str]:
    if not isinstance(value, str) or not QUEUE_NAME_RE.match(value):
        return [f"must be 1-64 characters from A-Z a-z 0-9 _ . -, not {value!r}."]
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


@dataclass(frozen=True)
class Option:
    """One row of the settings table that the engine reads (see the module docstring)."""

    #: The key in ``settings.DELAYQ``.
    name: str
    #: The default, as users write it; its type converts what they write (seconds: float).
    default: Any
    check: Check
    #: What it means, one line of the docs' settings table.
    doc: str
    #: The unit users write it in; "seconds" are kept in milliseconds.
    unit: str = ""

    def convert(self, value: Any) -> Any:
        """``value`` as users write it, as its Python type (raises ValueError)."""
        return float(value) if self.unit == "seconds" else type(self.default)(value)

    def to_engine(self, value: Any) -> Any:
        """``value`` as users write it, as the engine keeps it (raises ValueError)."""
        value = self.convert(value)
        return round(value * 1000) if self.unit == "seconds" else value


def option(name: str, default: Any, check: Check, doc: str, unit: str = "") -> Any:
    """A field of :class:`EngineConfig` that users set as ``DELAYQ[name]``."""
    row = Option(name, default, check, doc, unit)
    if isinstance(default, dict):
        return field(default_factory=dict, metadata={"option": row})
    return field(default=row.to_engine(default), metadata={"option": row})


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Engine settings. Fields ending in ``_ms`` hold the milliseconds of a setting
    written in seconds."""

    prefix: str = option("PREFIX", "dq", _prefix,
                         "prefix of every Redis key, inside the hash tag: `{prefix:queue}`")
    lease_ms: int = option("LEASE", 30.0, number(minimum=0.1),
                           "how long a claimed job stays leased without a heartbeat; "
                           "the heartbeat renews running jobs", "seconds")
    events_maxlen: int = option("EVENTS_MAXLEN", 100_000, number(minimum=0, integer=True),
                                "approximate cap of each queue's events stream (0: no events)",
                                "entries")
    events_max_bytes: int = option("EVENTS_MAX_BYTES", 64 * 1_048_576,
                                   number(minimum=0, integer=True),
                                   "memory cap of each queue's events stream, as Redis's "
                                   "`MEMORY USAGE` estimates it: the oldest entries go "
                                   "(0: no byte cap; [sizing](docs/sizing.md))", "bytes")
    result_ttl_ms: int = option("RESULT_TTL", 86_400, number(minimum=0),
                                "how long completed and cancelled jobs keep their data",
                                "seconds")
    failed_ttl_ms: int = option("FAILED_TTL", 7 * 86_400, number(minimum=0),
                                "how long dead-lettered jobs are kept", "seconds")
    keep_completed: int = option("KEEP_COMPLETED", 10_000, number(minimum=0, integer=True),
                                 "most completed (and cancelled) jobs kept per queue, "
                                 "their records with them", "jobs")
    keep_failed: int = option("KEEP_FAILED", 100_000, number(minimum=0, integer=True),
                              "most failed jobs kept per queue, their records with "
                              "them", "jobs")
    max_payload_bytes: int = option("MAX_PAYLOAD_BYTES", 1_048_576, number(minimum=0, integer=True),
                                    "largest encoded arguments accepted at enqueue "
                                    "(0: no limit)", "bytes")
    result_max_bytes: int = option("RESULT_MAX_BYTES", 1_048_576, number(minimum=0, integer=True),
                                   "largest encoded result kept; a task returning more "
                                   "fails its job (`ResultTooLarge`, not retried; 0: no "
                                   "limit)", "bytes")
    error_max_bytes: int = option("ERROR_MAX_BYTES", 20_000, number(minimum=100, integer=True),
                                  "most bytes of a failed attempt's traceback kept with "
                                  "the job (its end); its error line keeps its first "
                                  "2,000 at most", "bytes")
    progress_max_bytes: int = option("PROGRESS_MAX_BYTES", 500, number(minimum=0, integer=True),
                                     "most bytes of a progress message kept "
                                     "(`set_progress(message=...)`; longer ones are cut)",
                                     "bytes")
    #: Most due scheduled jobs promoted per claim call (not a setting).
    promote_batch: int = 1_000
    queues: Mapping[str, Mapping[str, Any]] = option(
        "QUEUES", {}, _queues,
        "per queue name: `shards` (1 to 1024), and `rate_limit` (`\"100/m\"`) or "
        "`interval` (seconds), e.g. `{\"api\": {\"interval\": 0.5, \"shards\": 4}}` "
        "([flow control](docs/flow-control.md))")
    min_replicas: int = option("MIN_REPLICAS", 0, number(minimum=0, integer=True),
                               "replicas that must confirm each enqueue (Redis `WAIT`, in the "
                               "same round trip) before it returns "
                               "([guarantees](docs/guarantees.md#failover))", "replicas")
    min_replicas_timeout_ms: int = option("MIN_REPLICAS_TIMEOUT", 1.0, number(minimum=0.001),
                                          "how long an enqueue waits for `MIN_REPLICAS` "
                                          "replicas, then raises `NotReplicated`", "seconds")
    min_replicas_acks: bool = option("MIN_REPLICAS_ACKS", False, boolean,
                                     "whether worker acks wait for `MIN_REPLICAS` replicas too")
    failover_retry_ms: int = option("FAILOVER_RETRY", 0.0, number(minimum=0),
                                    "how long an enqueue keeps retrying through a failover "
                                    "(connection lost, `READONLY`, no primary yet), with the "
                                    "same job id so a retry cannot add it twice", "seconds")
    #: Shards per queue name (queues not listed have one), from ``queues``.
    shards: Mapping[str, int] = field(init=False, repr=False, compare=False)
    #: Start limits per queue name (queues not listed have none), from ``queues``.
    limits: Mapping[str, RateLimit] = field(init=False, repr=False, compare=False)
    #: The events stream's bounds as the scripts take them, ``maxlen:max_bytes``.
    events_cap: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        shards, limits = {}, {}
        for name, spec in self.queues.items():
            try:
                options = queue_options(spec)
            except ValueError as exc:
                raise ValueError(f"QUEUES[{name!r}]: {exc}") from None
            shards[name] = options.shards
            if options.limit is not None:
                limits[name] = options.limit
        object.__setattr__(self, "shards", shards)
        object.__setattr__(self, "limits", limits)
        object.__setattr__(self, "events_cap", f"{self.events_maxlen}:{self.events_max_bytes}")

    @classmethod
    def from_settings(cls, given: Mapping[str, Any]) -> EngineConfig:
        """The config for settings by their ``DELAYQ`` names, as users write them; names
        left out keep their defaults. Raises ``ValueError`` naming a setting it cannot
        read (the system checks say more)."""
        values = {}
        for row, name in OPTIONS.values():
            if row.name in given:
                try:
                    values[name] = row.to_engine(given[row.name])
                except (TypeError, ValueError, OverflowError) as exc:
                    raise ValueError(f"{row.name}: {exc}") from None
        return cls(**values)


#: Every setting the engine reads, by its DELAYQ name: the row and the field it sets.
OPTIONS: dict[str, tuple[Option, str]] = {
    f.metadata["option"].name: (f.metadata["option"], f.name)
    for f in fields(EngineConfig) if "option" in f.metadata
}
