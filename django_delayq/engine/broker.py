"""The engine's entry point: every queue operation, each one Lua script call.

A :class:`Broker` wraps a redis-py client (``decode_responses=True``) and an
:class:`EngineConfig`. Producers call :meth:`Broker.enqueue` (one round trip) or
:meth:`Broker.enqueue_many` (one round trip per chunk). Workers build a :class:`Batch`
with the ``add_*`` methods so acks and the next claim share one round trip.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from base64 import urlsafe_b64encode
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import (
    ClusterError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import flows, validation
from .bulk import ChunkSender
from .claims import ClaimResult, parse_claim
from .codec import encode_arguments
from .commands import Commands, EncodedJob
from .config import EngineConfig
from .errors import DelayQConnectionError, NotReplicated, PartialClaimError
from .fields import stored
from .keys import GlobalKeys, QueueKeys
from .limits import RateLimit
from .pinned import PinnedConnections
from .reservations import claim_reserved
from .scripts import Batch, is_cluster_client
from .status import Status
from .urls import client_from_url as client_from_url  # re-exported

ID_BYTES = 12
ID_CHARS = 16
#: redis-py errors that mean Redis did not serve a call, not that the call was wrong.
#: (``RedisClusterException``, which is not a ``RedisError``, is what redis-py raises when
#: no node of a cluster answers; the engine never sends what it raises for misuse, such
#: as keys of several slots in one call.)
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, ClusterError, TryAgainError,
               RedisClusterException)
#: Errors after which an enqueue may be retried with the same job id: Redis did not
#: serve it, or a demoted primary refused it (``READONLY``).
FAILOVER = (*UNAVAILABLE, ReadOnlyError)
#: Seconds between the tries of an enqueue through a failover.
FAILOVER_INTERVAL = 0.2

logger = logging.getLogger(__name__)


def new_job_id() -> str:
    """A random job id: 96 bits in 16 URL-safe characters (short ids save Redis memory)."""
    return urlsafe_b64encode(os.urandom(ID_BYTES)).decode()


def new_job_ids(batch: int) -> Iterator[str]:
    """Endless job ids like :func:`new_job_id`'s, ``batch`` from each ``os.urandom`` call."""
    while True:
        # 12 bytes are exactly 16 base64 characters, so one encoding slices into ids.
        text = urlsafe_b64encode(os.urandom(ID_BYTES * batch)).decode()
        yield from (text[i:i + ID_CHARS] for i in range(0, len(text), ID_CHARS))


def _options_key(task: Any, priority: Any, max_attempts: Any) -> tuple[str, int, int] | None:
    """The options as a key of a bulk call's already-validated set, or None if their
    types are not exact (True == 1, but priority=True must still be refused)."""
    if type(task) is str and type(priority) is int and type(max_attempts) is int:
        return task, priority, max_attempts
    return None


@dataclass(slots=True, kw_only=True)
class EnqueueRequest:
    """One job to enqueue with :meth:`Broker.enqueue_many`."""

    task: str
    args: Sequence[Any] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    run_at: Any = None
    delay: Any = None
    priority: int = 0
    job_id: str | None = None
    max_attempts: int = 1
    #: Time limit of each attempt (seconds or a timedelta); None: the worker's default.
    timeout: Any = None
    #: Parents to wait for (jobs, job ids of this queue, or (queue, id) pairs): see
    #: :mod:`~django_delayq.engine.flows`.
    depends_on: Sequence[Any] | None = None
    on_parent_failure: str = "cancel"
    #: '' (nothing), 'one' or 'all' of the parents' results, as the first argument.
    pass_results: str = ""


@dataclass(slots=True)
class EnqueueResult:
    """What Redis said about one enqueued job."""

    job_id: str
    added: bool
    status: str
    run_at_ms: int
    enqueued_at_ms: int


@dataclass(slots=True)
class BulkResult:
    """Totals of :meth:`Broker.enqueue_many`."""

    enqueued: int = 0
    duplicates: int = 0
    #: The id of every job Redis took (added or a duplicate), in call order.
    job_ids: list[str] = field(default_factory=list)
    #: Ids that were not added because a job with that id exists (or came earlier).
    duplicate_ids: list[str] = field(default_factory=list)
    #: Round trips to Redis (one per chunk).
    chunks: int = 0


#: A job of a bulk call: encoded, with the parents it waits for (None: none).
Outgoing = tuple[EncodedJob, flows.Dependencies | None]


def _split_waits(broker: Broker, keys: QueueKeys,
                 items: Sequence[Outgoing]) -> tuple[list[EncodedJob], list[list[Any]]]:
    """The enqueue script's jobs and flow values of ``items``, jobs of the shard ``keys``
    (the script links each to its parents of that shard)."""
    jobs = [job for job, _ in items]
    waits = [deps.waits(index, deps.split(broker, keys)[0])
             for index, (_, deps) in enumerate(items, 1) if deps is not None]
    return jobs, waits


def _describe(client: Any) -> str:
    """The Redis address of ``client`` for error messages, never with its password."""
    try:
        pool = client.connection_pool
        kw = pool.connection_kwargs
    except AttributeError:
        return "the configured Redis"
    service = getattr(pool, "service_name", None)
    if service is not None:  # a Sentinel pool: the service, and the primary last known
        address = getattr(getattr(pool, "proxy", None), "master_address", None)
        where = f" (primary {address[0]}:{address[1]})" if address else ""
        return f"the Sentinel service {service!r}{where}, db {kw.get('db', 0)},"
    if "path" in kw:
        return f"unix://{kw['path']}?db={kw.get('db', 0)}"
    # A rediss:// URL shows in the connection class, not always in the kwargs.
    tls = (kw.get("ssl") or any(k.startswith("ssl_") for k in kw)
           or "SSL" in getattr(getattr(pool, "connection_class", None), "__name__", ""))
    scheme = "rediss" if tls else "redis"
    return f"{scheme}://{kw.get('host', 'localhost')}:{kw.get('port', 6379)}/{kw.get('db', 0)}"


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
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: Exception) -> DelayQConnectionError:
        if isinstance(exc, ClusterError | TryAgainError | RedisClusterException):
            return DelayQConnectionError(
                f"the Redis Cluster at {_describe(self.client)} did not serve the call (a "
                f"slot moving between nodes answers TRYAGAIN until the move ends; a failover "
                f"takes seconds): {exc}")
        if isinstance(exc, ReadOnlyError):
            return DelayQConnectionError(
                f"Redis at {_describe(self.client)} is a replica now (a failover demoted "
                f"it) and refused the write: {exc}")
        return DelayQConnectionError(f"Redis at {_describe(self.client)} is unreachable: {exc}")

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
        cfg = self.config
        args_json, kwargs_json = encode_arguments(task, args, kwargs, encoder=cfg.json_encoder,
                                                  names=arg_names,
                                                  limit=cfg.max_payload_bytes)
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
                if queue not in self._known_queues:
                    self._remember_queue(queue)
                if wait is None:
                    reply = self.commands.enqueue(keys, (job,))
                else:
                    reply, confirmed = self.commands.enqueue_and_wait(keys, (job,), wait)
                break
            except FAILOVER as exc:
                deadline = self._retry_or_raise(exc, deadline)
        added, status, run_at_ms, enqueued_at_ms = reply
        if wait is not None and confirmed < wait[0]:
            raise NotReplicated([job.job_id], confirmed, *wait)
        return EnqueueResult(job.job_id, bool(added), status, int(run_at_ms), int(enqueued_at_ms))

    def replica_wait(self) -> tuple[int, int] | None:
        """``(replicas, timeout_ms)`` for Redis WAIT after an enqueue, or None."""
        return self._replica_wait

    def _retry_or_raise(self, exc: Exception, deadline: float | None) -> float:
        """After a failed try: wait a little and return the retry deadline, or raise
        :class:`DelayQConnectionError` once ``failover_retry_ms`` has passed."""
        now = time.monotonic()
        if deadline is None:
            deadline = now + self.config.failover_retry_ms / 1000
        if now >= deadline:
            raise self._unreachable(exc) from exc
        logger.debug("Redis unavailable, retrying the enqueue error=%s", exc)
        time.sleep(min(FAILOVER_INTERVAL, max(0.0, deadline - now)))
        return deadline

    def _remember_queue(self, queue: str) -> None:
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
        chunk: list[Outgoing] = []
        checked: set[tuple[str, int, int]] = set()
        ids = new_job_ids(min(chunk_size, 1_000))
        known: set[tuple[str, str]] = set()  # the jobs of this call so far
        with self.connection_errors():
            # Chunk n is sent while chunk n + 1 is encoded (one round trip per chunk).
            sender = ChunkSender(lambda c: self._send_chunk(queue, c, total, results))
            try:
                chunk += _encoded
                for request in requests:
                    job = self.encode_request(request, checked=checked, ids=ids)
                    deps = None
                    if request.depends_on is not None:
                        deps = flows.dependencies(request.depends_on, queue,
                                                  request.on_parent_failure,
                                                  request.pass_results)
                    if deps is not None:
                        flows.check_parents_exist(
                            self, [p for p in deps.parents if p not in known])
                    known.add((queue, job.job_id))
                    chunk.append((job, deps))
                    if len(chunk) >= chunk_size:
                        sender.send(chunk)
                        chunk = []
                if chunk:
                    sender.send(chunk)
            except (TypeError, ValueError) as exc:
                sender.finish()
                raise type(exc)(f"{exc} (enqueue_many stopped: {total.enqueued} jobs of "
                                f"earlier chunks were enqueued, this chunk was not)") from exc
            finally:
                sender.finish()
        return total

    def _by_shard(self, queue: str, chunk: list[Outgoing]) -> dict[QueueKeys, list[Outgoing]]:
        """The jobs of ``chunk`` grouped by the shard their id picks."""
        if self.shard_count(queue) == 1:
            return {self.keys_for(queue, ""): chunk}
        by_shard: dict[QueueKeys, list[Outgoing]] = {}
        for item in chunk:
            by_shard.setdefault(self.keys_for(queue, item[0].job_id), []).append(item)
        return by_shard

    def _send_chunk(
        self,
        queue: str,
        chunk: list[Outgoing],
        total: BulkResult,
        results: list[EnqueueResult] | None,
    ) -> None:
        by_shard = self._by_shard(queue, chunk)  # checks the queue name
        single = len(by_shard) == 1
        if queue not in self._known_queues:  # once a chunk is valid: a refusal leaves no trace
            self._remember_queue(queue)
        wait = self.replica_wait()
        deadline = None
        confirmed: int | None = None
        answered: dict[QueueKeys, Any] = {}  # the reply of each shard that answered
        counted = False
        try:
            while True:
                try:
                    sent, sent_confirmed = self._send_by_shard(by_shard, wait)
                except FAILOVER as exc:  # the same ids again: a retry cannot add a job twice
                    deadline = self._retry_or_raise(exc, deadline)
                    continue
                if not counted:
                    total.chunks += 1
                    counted = True
                if sent_confirmed is not None:
                    confirmed = sent_confirmed if confirmed is None else min(confirmed,
                                                                             sent_confirmed)
                failed = []
                for keys, reply, items in sent:
                    if isinstance(reply, Exception):
                        failed.append((keys, reply, items))
                    else:
                        answered[keys] = reply
                refusal = next((reply for _, reply, _ in failed
                                if not isinstance(reply, FAILOVER)), None)
                if refusal is not None:
                    raise refusal
                if not failed:
                    break
                # Shards whose reply is a failover error (their node died or was demoted,
                # their slot is moving) are sent again, alone, with the same ids.
                deadline = self._retry_or_raise(failed[0][1], deadline)
                by_shard = {keys: items for keys, _, items in failed}
        finally:
            # What the shards that answered added counts, even when the call raises.
            sent_in_order = ([(reply, chunk) for reply in answered.values()] if single
                             else self._in_call_order(queue, chunk, answered))
            self._count_sent(sent_in_order, total, results)
        # Only now that every shard answered are the parents of this chunk stored: a
        # dependant linked while its parent's shard was still being retried would find
        # it missing. (On an error, its dependants stay in the linking set: a
        # heartbeat's repair links them.)
        self._link_elsewhere(queue, sent_in_order)
        if wait is not None and confirmed is not None and confirmed < wait[0]:
            raise NotReplicated([job.job_id for job, _ in chunk], confirmed, *wait)

    def _in_call_order(self, queue: str, chunk: list[Outgoing],
                       answered: dict[QueueKeys, Any]) -> list[tuple[Any, list[Outgoing]]]:
        """The replies of the shards that ``answered`` and their jobs, in the order of
        ``chunk`` (the shards are sent one call each, so their replies come shard by
        shard): ``BulkResult.job_ids``, ``results`` and the workflows that zip their
        steps with them see the jobs as the caller gave them."""
        reply_rows: list[Any] = []
        items: list[Outgoing] = []
        cursor = dict.fromkeys(answered, 0)
        for item in chunk:
            keys = self.keys_for(queue, item[0].job_id)
            reply = answered.get(keys)
            if reply is None:
                continue  # its shard did not answer
            at = cursor[keys]
            cursor[keys] = at + 4
            reply_rows += reply[at:at + 4]
            items.append(item)
        return [(reply_rows, items)]

    @staticmethod
    def _count_sent(sent: list[tuple[Any, list[Outgoing]]], total: BulkResult,
                    results: list[EnqueueResult] | None) -> None:
        """Add the jobs of the replies ``sent`` (4 values a job) to ``total`` (and
        ``results``)."""
        for reply, items in sent:
            ids = [job.job_id for job, _ in items]
            added = reply[0::4]
            total.job_ids += ids
            new = sum(1 for flag in added if flag)
            total.enqueued += new
            if new < len(ids):
                duplicates = [job_id for job_id, flag in zip(ids, added, strict=True) if not flag]
                total.duplicates += len(duplicates)
                total.duplicate_ids += duplicates
            if results is not None:
                results += [
                    EnqueueResult(job_id, bool(flag), status, int(run_at_ms), int(enqueued_at_ms))
                    for job_id, flag, status, run_at_ms, enqueued_at_ms in zip(
                        ids, added, reply[1::4], reply[2::4], reply[3::4], strict=True)
                ]

    def _link_elsewhere(self, queue: str, sent: list[tuple[Any, list[Outgoing]]]) -> None:
        """After every shard of a chunk answered: link the new waiting jobs to their
        parents in other shards (the script linked those of their own), and link again
        the jobs that were already there and still wait (their first producer may have
        died before linking them)."""
        new: list[tuple[QueueKeys, str, list[flows.Link]]] = []
        again: list[tuple[QueueKeys, str]] = []
        for reply, items in sent:
            for (job, deps), added, status in zip(items, reply[0::4], reply[1::4],
                                                  strict=True):
                if added and deps is not None:
                    keys = self.keys_for(queue, job.job_id)
                    _, elsewhere = deps.split(self, keys)
                    if elsewhere:
                        new.append((keys, job.job_id, elsewhere))
                elif not added and status == Status.WAITING:
                    again.append((self.keys_for(queue, job.job_id), job.job_id))
        if new:
            flows.link(self, new)
        if again:
            flows.relink(self, again)

    def _send_by_shard(
        self, by_shard: dict[QueueKeys, list[Outgoing]], wait: tuple[int, int] | None,
    ) -> tuple[list[tuple[QueueKeys, Any, list[Outgoing]]], int | None]:
        """Send one enqueue call per shard (and WAIT, with ``wait``): per shard its keys,
        its reply (an error in its place) and its jobs, and how many replicas confirmed
        the calls that succeeded (None without ``wait``)."""
        if len(by_shard) == 1 and self._pinned is not None:
            # One shard: one script call on a pinned connection, without a pipeline.
            ((keys, items),) = by_shard.items()
            jobs, waits = _split_waits(self, keys, items)
            if wait is None:
                return [(keys, self.commands.enqueue(keys, jobs, waits), items)], None
            reply, confirmed = self.commands.enqueue_and_wait(keys, jobs, wait, waits)
            return [(keys, reply, items)], confirmed
        batch = self.batch()
        order = [(keys, self.commands.add_enqueue(batch, keys, *_split_waits(self, keys, items)),
                  items) for keys, items in by_shard.items()]
        # A shard that refuses its call (its cluster slot is moving) must not hide what
        # the others added: they are counted in ``total`` before the error is raised.
        replies = batch.run(raise_on_error=False, wait=wait)
        return [(keys, replies[index], items) for keys, index, items in order], batch.confirmed

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
