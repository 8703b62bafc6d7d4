"""Plain engine configuration: what the engine needs to know, with no Django in sight."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .limits import RateLimit

DAY_MS = 86_400_000


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Engine settings; the Django layer builds one from ``settings.DELAYQ``."""

    #: Prefix of every key (inside the hash tag: ``{prefix:queue}``).
    prefix: str = "dq"
    #: Default lease of a claimed job, in ms; the heartbeat extends it while it runs.
    lease_ms: int = 30_000
    #: Approximate cap of each queue's events stream (0 turns events off).
    events_maxlen: int = 100_000
    #: How long completed and cancelled jobs keep their hash (result), in ms.
    result_ttl_ms: int = DAY_MS
    #: How long dead-lettered jobs are kept, in ms.
    failed_ttl_ms: int = 7 * DAY_MS
    #: Most completed (and cancelled) ids kept per queue.
    keep_completed: int = 10_000
    #: Most failed ids kept per queue.
    keep_failed: int = 100_000
    #: Largest encoded arguments accepted, in bytes (0: no limit).
    max_payload_bytes: int = 1_048_576
    #: Most due scheduled jobs promoted per claim call.
    promote_batch: int = 1_000
    #: Number of shards per queue name; queues not listed have one.
    shards: Mapping[str, int] = field(default_factory=dict)
    #: Start limits per queue name (rate limits and intervals); queues not listed have none.
    limits: Mapping[str, RateLimit] = field(default_factory=dict)
    #: Replicas that must confirm each enqueue (Redis WAIT) before it returns; 0: none.
    min_replicas: int = 0
    #: How long an enqueue waits for those confirmations, in ms (then NotReplicated).
    min_replicas_timeout_ms: int = 1_000
    #: Whether worker acks wait for the replicas too (they are resent if not confirmed).
    min_replicas_acks: bool = False
    #: How long an enqueue keeps retrying through a failover (connection lost,
    #: READONLY, no primary yet), in ms, with the same job id so a retry cannot
    #: duplicate it; 0 leaves retries to the client's own policy.
    failover_retry_ms: int = 0
