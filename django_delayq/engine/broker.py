"""The engine's entry point: every queue operation, each one Lua script call.

A :class:`Broker` wraps a redis-py client (``decode_responses=True``) and an
:class:`EngineConfig`. Producers call :meth:`Broker.enqueue` (one round trip) or
:meth:`Broker.enqueue_many` (one round trip per chunk). Workers build a :class:`Batch`
with the ``add_*`` methods so acks and the next claim share one round trip.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from redis.exceptions import RedisError

from . import flows, validation
from .bulk import BulkEnqueue, Outgoing
from .claims import ClaimResult, parse_claim
from .codec import encode_arguments
from .commands import Commands, EncodedJob
from .config import EngineConfig
from .errors import NotReplicated, PartialClaimError
from .failover import FAILOVER, UNAVAILABLE, retry_or_raise, unreachable
from .fields import stored
from .keys import GlobalKeys, QueueKeys
from .limits import RateLimit
from .pinned import PinnedConnections
from .requests import BulkResult, EnqueueRequest, EnqueueResult, new_job_id
from .reservations import claim_reserved
from .scripts import Batch, is_cluster_client
from .urls import client_from_url as client_from_url  # re-exported

__all__ = ["Broker", "BulkResult", "EnqueueRequest", "EnqueueResult", "client_from_url"]


def _options_key(task: Any, priority: Any, max_attempts: Any) -> tuple[str, int, int] | None:
    """The options as a key of a bulk call's already-validated set, or None if their
    types are not exact (True == 1, but priority=True must still be refused)."""
    if type(task) is str and type(priority) is int and type(max_attempts) is int:
        return task, priority, max_attempts
    return None


class Broker:
    """Queue operations over one Redis client. Thread-safe, like the client it wraps."""

    def __init__(self, client: Any, config: EngineConfig | None = None) -> None:
        self.client = client
        self.config = config or EngineConfig()
        self.global_keys = GlobalKeys(self.config.prefix)
        self._known_queues: set[str] = set()
        self.is_cluster = is_cluster_client(client)
        self._shard_keys: dict[str, list[QueueKeys]] = {}
        # Single script calls skip redis-py's per-call pool checkout (see pinned.py).
        self._pinned = None if self.is_cluster else PinnedConnections.for_client(client)
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
    ) -> EncodedJob:
        """Validate and encode one job as :meth:`enqueue` sends it (a new id when the
        request has none), without sending it: the outbox and eager mode store or run
        this, so their jobs pass exactly the checks of a direct enqueue.

        ``checked`` remembers options already validated (a bulk call's jobs mostly share
        them); ``ids`` supplies new job ids.
        """
        return self._encode(request.task, request.args, request.kwargs, request.run_at,
                            request.delay, request.priority, request.job_id,
                            request.max_attempts, request.timeout, arg_names, checked, ids)

    def _encode(self, task: str, args: Sequence[Any], kwargs: dict[str, Any], run_at: Any,
                delay: Any, priority: int, job_id: str | None, max_attempts: int,
                timeout: Any, arg_names: Sequence[str],
                checked: set[tuple[str, int, int]] | None,
                ids: Iterator[str] | None) -> EncodedJob:
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
        if job_id is not None:
            job_id = validation.validate_job_id(job_id)
        else:
            job_id = new_job_id() if ids is None else next(ids)
        args_json, kwargs_json = encode_arguments(task, args, kwargs, names=arg_names,
                                                  limit=self.config.max_payload_bytes)
        # tuple.__new__: a NamedTuple's own __new__ is Python code, 0.15 us more a job of
        # a bulk call (the fields are in order, as EncodedJob(...) would take them).
        return tuple.__new__(EncodedJob, (job_id, task, args_json, kwargs_json, priority,
                                          run_at_ms, delay_ms, max_attempts, timeout_ms))

    def enqueue(
        self,
        queue: str,
        task: str,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        run_at: Any = None,
        delay: Any = None,
        priority: int = 0,
        job_id: str | None = None,
        max_attempts: int = 1,
        arg_names: Sequence[str] = (),
        timeout: Any = None,
        depends_on: Sequence[Any] | None = None,
        on_parent_failure: str = "cancel",
        pass_results: str = "",
    ) -> EnqueueResult:
        """Enqueue one job in one round trip. A job whose id exists is not added twice.

        With ``depends_on`` the job waits for its parents (status ``waiting``; see
        :mod:`~django_delayq.engine.flows`): they are checked to exist first, then the
        job is stored and linked to them (a few round trips).
        """
        deps = flows.dependencies(depends_on, queue, on_parent_failure, pass_results)
        job = self._encode(task, args, kwargs or {}, run_at, delay, priority, job_id,
                           max_attempts, timeout, arg_names, None, None)
        if deps is not None:
            validation.validate_queue_name(queue)
            flows.check_parents_exist(self, deps.parents)
            results: list[EnqueueResult] = []
            self.enqueue_many(queue, [], results=results, _encoded=[(job, deps)])
            res = results[0]
            if res.added:  # parents that had finished may have released it already
                with self.connection_errors():
                    res.status = self.client.hget(self.keys_for(queue, res.job_id).job(
                        res.job_id), stored("status")) or res.status
            return res
        keys = self.keys_for(queue, job.job_id)
        wait = self._replica_wait
        # The job id is chosen above, before the first try: a retry through a failover
        # finds the job if the first try landed, so it cannot add it twice.
        deadline = None
        while True:
            # try/except, not connection_errors(): the hot path of every producer (fastpaths.py)
            try:
                if queue not in self._known_queues:  # remember_queue's check, inline: no call
                    self.remember_queue(queue)
                if wait is None:
                    reply = self.commands.enqueue(keys, (job,))
                else:
                    reply, confirmed = self.commands.enqueue_and_wait(keys, (job,), wait)
                break
            except FAILOVER as exc:
                deadline = self.retry_or_raise(exc, deadline)
        added, status, run_at_ms, enqueued_at_ms = reply
        if wait is not None and confirmed < wait[0]:
            raise NotReplicated([job.job_id], confirmed, *wait)
        return EnqueueResult(job.job_id, bool(added), status, int(run_at_ms), int(enqueued_at_ms))

    def replica_wait(self) -> tuple[int, int] | None:
        """``(replicas, timeout_ms)`` for Redis WAIT after an enqueue, or None."""
        return self._replica_wait

    def retry_or_raise(self, exc: Exception, deadline: float | None) -> float:
        """After a failed try of an enqueue: :func:`.failover.retry_or_raise` with this
        broker's client and ``failover_retry_ms``."""
        return retry_or_raise(self.client, self.config.failover_retry_ms, exc, deadline)

    def remember_queue(self, queue: str) -> None:
        """Add ``queue`` to the set of known queues (once per process and queue)."""
        if queue not in self._known_queues:
            self.client.sadd(self.global_keys.queues, queue)
            self._known_queues.add(queue)

    def enqueue_many(
        self,
        queue: str,
        requests: Iterable[EnqueueRequest],
        *,
        chunk_size: int = 1_000,
        results: list[EnqueueResult] | None = None,
        total: BulkResult | None = None,
        _encoded: Sequence[Outgoing] = (),
    ) -> BulkResult:
        """Enqueue many jobs: each chunk of ``chunk_size`` is one round trip.

        A request with ``depends_on`` may name jobs of earlier requests of the call
        (they are sent first); other parents must exist, checked before its chunk is
        sent. A chunk of waiting jobs takes two more round trips (link, and resolve
        for parents already finished).

        Every request is validated and encoded before anything of its chunk is sent, so
        a bad request raises without enqueuing its chunk; the error names how many jobs
        earlier chunks enqueued. Duplicate ids are skipped, counted and listed. Pass a
        list as ``results`` to receive one :class:`EnqueueResult` each (in call order, as
        ``job_ids``), and ``total`` to have the totals filled in even when an error
        interrupts the call.
        """
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be at least 1, not {chunk_size}")
        total = BulkResult() if total is None else total
        BulkEnqueue(self, queue, total, results).run(requests, chunk_size, _encoded)
        return total

    # -- the worker protocol ------------------------------------------------------

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

    def claim(
        self, queue: str, count: int, worker: str, lease_ms: int | None = None
    ) -> list[ClaimResult]:
        """Claim up to ``count`` jobs from each shard of ``queue`` (see :meth:`claim_many`)."""
        return self.claim_many([(keys, count) for keys in self.shards(queue)], worker, lease_ms)

    def claim_many(
        self, wants: Sequence[tuple[QueueKeys, int]], worker: str, lease_ms: int | None = None
    ) -> list[ClaimResult]:
        """Claim up to ``count`` jobs from each ``(shard, count)`` of ``wants``, over any
        queues, in one round trip.

        A limited queue sharded over a cluster (:meth:`reserves_starts`) reserves its
        starts first and then claims its shards one by one (more round trips); the
        largest count of its shards is what it may start in all. If some calls fail (a
        cluster slot on the move), raises :class:`PartialClaimError` holding the answers
        of the others and the jobs they leased, or the first failure if none answered.
        """
        plain = [(keys, count) for keys, count in wants if not self.reserves_starts(keys.queue)]
        reserving: dict[str, list[tuple[QueueKeys, int]]] = {}
        for keys, count in wants:
            if self.reserves_starts(keys.queue):
                reserving.setdefault(keys.queue, []).append((keys, count))
        results: list[ClaimResult] = []
        failure: BaseException | None = None
        if plain:
            batch = self.batch()
            for keys, count in plain:
                self.add_claim(batch, keys, count, worker, lease_ms)
            try:
                results = self.run_claims(batch, [keys for keys, _ in plain])
            except PartialClaimError as exc:
                results, failure = exc.results, exc.__cause__ or exc
            except RedisError as exc:
                failure = exc
        for queue, shards in reserving.items():
            try:
                results += claim_reserved(self, queue, [keys for keys, _ in shards],
                                          max(count for _, count in shards), worker, lease_ms)
            except PartialClaimError as exc:
                results += exc.results
                failure = failure or exc.__cause__ or exc
            except RedisError as exc:
                failure = failure or exc
        if failure is not None:
            if results:
                raise PartialClaimError(results, len(wants) - len(results)) from failure
            raise failure
        return results

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

    def add_start(
        self, batch: Batch, keys: QueueKeys, worker: str, started: Sequence[tuple[str, int, int]]
    ) -> int:
        """Add a note that ``(job_id, attempt, start ms)`` claimed jobs started running."""
        return self.commands.add_start(batch, keys, worker, started)

    def add_complete(
        self, batch: Batch, keys: QueueKeys,
        done: Sequence[tuple[str, int, str] | tuple[str, int, str, int]],
    ) -> int:
        """Add acks of ``(job_id, attempt, result_json[, start ms])`` on the shard ``keys``
        (the start time, for the attempt log, when the job's own is not recorded)."""
        return self.commands.add_complete(batch, keys, done)

    def add_fail(
        self,
        batch: Batch,
        keys: QueueKeys,
        job_id: str,
        attempt: int,
        error: str,
        traceback: str,
        retry_delay_ms: int,
        started_ms: int = 0,
    ) -> int:
        """Add a failed attempt to ``batch``; ``retry_delay_ms`` -1 forbids a retry."""
        return self.commands.add_fail(batch, keys, job_id, attempt, error, traceback,
                                      retry_delay_ms, started_ms)

    def add_extend(
        self, batch: Batch, keys: QueueKeys, leases: Sequence[tuple[str, int]], lease_ms: int
    ) -> int:
        """Add a lease extension of ``(job_id, attempt)`` pairs to ``batch``."""
        return self.commands.add_extend(batch, keys, leases, lease_ms)

    def add_reclaim(self, batch: Batch, keys: QueueKeys, limit: int = 1_000, *,
                    link_grace_ms: int | None = None) -> int:
        """Add a reclaim of expired leases on the shard ``keys`` to ``batch``; its reply
        also lists the waiting jobs to link again (see :func:`.flows.repair`), those
        unconfirmed for ``link_grace_ms`` (default: one lease)."""
        grace = self.config.lease_ms if link_grace_ms is None else link_grace_ms
        return self.commands.add_reclaim(batch, keys, limit, grace)

    def add_release(
        self, batch: Batch, keys: QueueKeys, leases: Sequence[tuple[str, int]], *,
        started: bool,
    ) -> int:
        """Add a hand-back of leased jobs to ``batch`` (their attempt counts if ``started``)."""
        return self.commands.add_release(batch, keys, leases, started=started)

    def reclaim(self, queue: str, limit: int = 1_000) -> tuple[int, int]:
        """Reclaim expired leases of ``queue``: (returned to ready, dead-lettered). The
        waiting jobs the calls hand over to link again are linked (:func:`.flows.repair`)."""
        shards = self.shards(queue)
        batch = self.batch()
        for keys in shards:
            self.add_reclaim(batch, keys, limit)
        with self.connection_errors():
            replies = batch.run()
        for keys, reply in zip(shards, replies, strict=True):
            if reply[3]:
                flows.repair(self, keys, reply[3])
        return sum(int(r[0]) for r in replies), sum(int(r[1]) for r in replies)

    def server_time_ms(self) -> int:
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000
