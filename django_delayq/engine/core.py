"""What every operation of a :class:`~django_delayq.engine.broker.Broker` is built from.

A :class:`BrokerCore` holds a redis-py client (``decode_responses=True``) and an
:class:`EngineConfig`, with what follows from them: the scripts
(:class:`~django_delayq.engine.commands.Commands`), each queue's shards and start limit,
the checks and encoding of a job, the claim calls, and redis-py's errors in the engine's
words. The modules that build an operation from several calls (workflows in
:mod:`.flows`, bulk enqueues in :mod:`.bulk`, reserved starts in :mod:`.reservations`)
take a core; :class:`~django_delayq.engine.broker.Broker`, a core with the operations,
imports them.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from redis.exceptions import RedisError

from . import keyed as keyed_options
from . import validation
from .claims import ClaimResult, parse_claim
from .codec import encode_arguments
from .commands import Commands, EncodedJob
from .config import EngineConfig
from .errors import CommandRefused, DelayQError, PartialClaimError
from .failover import FAILOVER, UNAVAILABLE, retry_or_raise, unreachable
from .keys import GlobalKeys, QueueKeys
from .limits import RateLimit
from .pinned import PinnedConnections
from .requests import EnqueueRequest, new_job_id, new_job_ids
from .scripts import Batch, is_cluster_client

#: Seconds after which :meth:`BrokerCore.recent_server_time_ms` reads the clock again.
CLOCK_READ_EVERY = 60.0
#: Seconds after which an enqueue adds its queue to the known set again (one SADD).
REMEMBER_EVERY = 60.0


def _options_key(task: Any, priority: Any, max_attempts: Any) -> tuple[str, int, int] | None:
    """The options as a key of a bulk call's already-validated set, or None if their
    types are not exact (True == 1, but priority=True must still be refused)."""
    if type(task) is str and type(priority) is int and type(max_attempts) is int:
        return task, priority, max_attempts
    return None


class BrokerCore:
    """A Redis client and an engine config, with the calls every operation is made of.
    Thread-safe, like the client it wraps."""

    def __init__(self, client: Any, config: EngineConfig | None = None) -> None:
        self.client = client
        self.config = config or EngineConfig()
        self.global_keys = GlobalKeys(self.config.prefix)
        #: Queue name -> when (monotonic s) this process last added it to the known set.
        self._known_queues: dict[str, float] = {}
        self.is_cluster = is_cluster_client(client)
        self._shard_keys: dict[str, list[QueueKeys]] = {}
        # Single script calls skip redis-py's per-call pool checkout (see pinned.py).
        self._pinned = None if self.is_cluster else PinnedConnections.for_client(client)
        #: The Redis clock's offset from this process's monotonic one (ms), and when read.
        self._clock_offset: tuple[float, float] | None = None
        self.commands = Commands(client, self.config, self._pinned)
        cfg = self.config  # frozen: what WAIT asks for is known once
        self._replica_wait = None if cfg.min_replicas <= 0 else (
            cfg.min_replicas, cfg.min_replicas_timeout_ms)

    # -- keys ---------------------------------------------------------------------

    def rate_limit(self, queue: str) -> RateLimit | None:
        """The start limit of ``queue`` (rate limit or interval), if it has one."""
        return self.config.limits.get(queue)

    def limit_key(self, queue: str) -> str:
        """The one start-rate window of ``queue``, shared by all its shards."""
        return QueueKeys(self.config.prefix, queue).limit

    def reserves_starts(self, queue: str) -> bool:
        """Whether claims on ``queue`` reserve starts first (see :meth:`reserve`).

        True for a limited queue whose shards sit in other cluster slots than its
        window; elsewhere the claim script counts starts in the window itself.
        """
        return self.is_cluster and self.shard_count(queue) > 1 and (
            self.rate_limit(queue) is not None
        )

    def shard_count(self, queue: str) -> int:
        return max(1, int(self.config.shards.get(queue, 1)))

    def shards(self, queue: str) -> list[QueueKeys]:
        """The keys of every shard of ``queue``."""
        validation.validate_queue_name(queue)
        n = self.shard_count(queue)
        if n == 1:
            return [QueueKeys(self.config.prefix, queue)]
        return [QueueKeys(self.config.prefix, queue, i) for i in range(n)]

    def keys_for(self, queue: str, job_id: str) -> QueueKeys:
        """The keys of the shard that holds ``job_id`` (chosen from the id)."""
        shards = self._shard_keys.get(queue)
        if shards is None:
            shards = self._shard_keys[queue] = self.shards(queue)
        if len(shards) == 1:
            return shards[0]
        return shards[zlib.crc32(job_id.encode()) % len(shards)]

    def batch(self) -> Batch:
        return Batch(self.client)

    @contextmanager
    def connection_errors(self) -> Iterator[None]:
        """Turn redis-py connection failures into :class:`DelayQConnectionError`."""
        try:
            yield
        except UNAVAILABLE as exc:
            raise unreachable(self.client, exc) from exc

    @contextmanager
    def read_errors(self) -> Iterator[None]:
        """:meth:`connection_errors`, and any other error Redis answers with (a command an
        ACL refuses, a key of another type) as :class:`CommandRefused`: the reads that
        pages, the API and the metrics show, and an operator's changes to a job (cancel,
        retry, reschedule), raise the engine's errors only. ``READONLY``
        counts as unreachable: a read that keeps marks (the totals,
        ``lua/counters.lua``) reached a demoted primary, whose connections are closed."""
        try:
            yield
        except FAILOVER as exc:
            raise unreachable(self.client, exc) from exc
        except DelayQError:
            raise
        except RedisError as exc:
            raise CommandRefused(exc) from exc

    def close(self) -> None:
        """Close the client's connections (pinned ones included); later calls reconnect."""
        if self._pinned is not None:
            self._pinned.close()
        self.client.close()

    # -- producing ----------------------------------------------------------------

    def encode_request(
        self,
        request: EnqueueRequest,
        arg_names: Sequence[str] = (),
        *,
        checked: set[tuple[str, int, int]] | None = None,
        ids: Iterator[str] | None = None,
        shards: int = 1,
    ) -> EncodedJob:
        """Validate and encode one job as :meth:`enqueue` sends it (a new id when the
        request has none), without sending it: the outbox and eager mode store or run
        this, so their jobs pass exactly the checks of a direct enqueue.

        ``checked`` remembers options already validated (a bulk call's jobs mostly share
        them); ``ids`` supplies new job ids; ``shards``: the queue's shard count (a keyed
        job's id is chosen to land in its key's shard).
        """
        return self._encode(request.task, request.args, request.kwargs, request.run_at,
                            request.delay, request.priority, request.job_id,
                            request.max_attempts, request.timeout, arg_names, checked, ids,
                            request.traceparent, request.keyed, shards)

    def _encode(self, task: str, args: Sequence[Any], kwargs: dict[str, Any], run_at: Any,
                delay: Any, priority: int, job_id: str | None, max_attempts: int,
                timeout: Any, arg_names: Sequence[str],
                checked: set[tuple[str, int, int]] | None,
                ids: Iterator[str] | None, traceparent: str = "",
                keyed: keyed_options.KeyedOptions | None = None,
                shards: int = 1) -> EncodedJob:
        """:meth:`encode_request` of the request's fields (a single enqueue builds none)."""
        key = _options_key(task, priority, max_attempts)
        if checked is None or key is None or key not in checked:
            validation.check_task_name(task)
            validation.check_priority(priority)
            validation.check_max_attempts(max_attempts)
            if checked is not None and key is not None:
                checked.add(key)
        if run_at is not None and delay is not None:
            raise ValueError("give run_at or delay, not both")
        run_at_ms = "" if run_at is None else validation.run_at_ms(run_at)
        delay_ms = "" if delay is None else validation.delay_ms(delay)
        timeout_ms = "" if timeout is None else validation.timeout_ms(timeout)
        if keyed is not None:
            job_id = self._keyed_job_id(keyed, job_id, ids, shards)
        elif job_id is not None:
            job_id = validation.validate_new_job_id(job_id)
        else:
            job_id = new_job_id() if ids is None else next(ids)
        args_json, kwargs_json = encode_arguments(task, args, kwargs, names=arg_names,
                                                  limit=self.config.max_payload_bytes)
        # tuple.__new__: a NamedTuple's own __new__ is Python code, 0.15 us more a job of
        # a bulk call (the fields are in order, as EncodedJob(...) would take them).
        return tuple.__new__(EncodedJob, (job_id, task, args_json, kwargs_json, priority,
                                          run_at_ms, delay_ms, max_attempts, timeout_ms,
                                          traceparent, keyed))

    @staticmethod
    def _keyed_job_id(keyed: keyed_options.KeyedOptions, job_id: str | None,
                      ids: Iterator[str] | None, shards: int) -> str:
        """The id of a keyed job: in the shard of its key (its slots, turns and dedupe
        record live there)."""
        key = keyed_options.shard_key(keyed)
        if job_id is None:
            if shards <= 1:
                return new_job_id() if ids is None else next(ids)
            return keyed_options.id_in_shard(key, shards, ids or new_job_ids(8))
        job_id = validation.validate_new_job_id(job_id)
        if shards > 1 and zlib.crc32(job_id.encode()) % shards != zlib.crc32(
                key.encode()) % shards:
            raise ValueError(f"job id {job_id!r} is not in the shard of its key {key!r}: "
                             "leave the id out for a keyed job of a sharded queue")
        return job_id

    def replica_wait(self) -> tuple[int, int] | None:
        """``(replicas, timeout_ms)`` for Redis WAIT after an enqueue, or None."""
        return self._replica_wait

    def retry_or_raise(self, exc: Exception, deadline: float | None) -> float:
        """After a failed try of an enqueue: :func:`.failover.retry_or_raise` with this
        broker's client and ``failover_retry_ms``."""
        return retry_or_raise(self.client, self.config.failover_retry_ms, exc, deadline)

    def remember_queue(self, queue: str) -> None:
        """Add ``queue`` to the set of known queues (once per process, queue and
        :data:`REMEMBER_EVERY` seconds, so a queue forgotten while this process still
        enqueues into it is known again within that time)."""
        now = time.monotonic()
        if now - self._known_queues.get(queue, -REMEMBER_EVERY) >= REMEMBER_EVERY:
            self.client.sadd(self.global_keys.queues, queue)
            self._known_queues[queue] = now

    def forget_queue(self, queue: str) -> None:
        """Remove ``queue`` from the set of known queues (see :meth:`Queue.forget`)."""
        self.client.srem(self.global_keys.queues, queue)
        self._known_queues.pop(queue, None)

    # -- claims -------------------------------------------------------------------

    def add_claim(
        self, batch: Batch, keys: QueueKeys, count: int, worker: str, lease_ms: int | None = None,
        *, reserved: bool = False,
    ) -> int:
        """Add a claim of up to ``count`` jobs on the shard ``keys`` to ``batch``.

        The queue's start limit is enforced by the script unless ``reserved`` says the
        starts were already granted by :meth:`reserve`.
        """
        limit = None if reserved else self.rate_limit(keys.queue)
        if limit is not None and not self.reserves_starts(keys.queue):
            return self.commands.add_claim(batch, keys, count, worker,
                                           lease_ms or self.config.lease_ms,
                                           self.limit_key(keys.queue), limit.limit,
                                           limit.period_ms)
        return self.commands.add_claim(batch, keys, count, worker,
                                       lease_ms or self.config.lease_ms, keys.limit, 0, 0)

    parse_claim = staticmethod(parse_claim)

    def run_claims(self, batch: Batch, shards: Sequence[QueueKeys]) -> list[ClaimResult]:
        """Run ``batch``, one claim per shard of ``shards`` in order, and parse the replies.

        If claims fail (a cluster slot on the move, a node out of memory), raises
        :class:`PartialClaimError` holding the answers of the others (and the jobs they
        leased), or the first failure if no shard answered.
        """
        replies = batch.run(raise_on_error=False)
        failures = [r for r in replies if isinstance(r, Exception)]
        results = [self.parse_claim(keys, reply)
                   for keys, reply in zip(shards, replies, strict=True)
                   if not isinstance(reply, Exception)]
        if failures:
            if results:
                raise PartialClaimError(results, len(failures)) from failures[0]
            raise failures[0]
        return results

    def server_time_ms(self) -> int:
        seconds, micros = self.client.time()
        now_ms = int(seconds) * 1000 + int(micros) // 1000
        self._clock_offset = (now_ms - time.monotonic() * 1000, time.monotonic())
        return now_ms

    def recent_server_time_ms(self) -> int:
        """The Redis clock now, from its last reading (read again after
        :data:`CLOCK_READ_EVERY` seconds): for a reader that wants a round trip less and
        can bear the drift of a minute (whether a worker is alive), never for a due time."""
        offset = self._clock_offset
        if offset is None or time.monotonic() - offset[1] > CLOCK_READ_EVERY:
            return self.server_time_ms()
        return int(offset[0] + time.monotonic() * 1000)
