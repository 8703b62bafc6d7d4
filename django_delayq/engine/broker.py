"""The engine's entry point: every queue operation, each one Lua script call.

A :class:`Broker` is a :class:`~django_delayq.engine.core.BrokerCore` (a redis-py client
with ``decode_responses=True`` and an :class:`EngineConfig`) with the operations.
Producers call :meth:`Broker.enqueue` (one round trip) or :meth:`Broker.enqueue_many`
(one round trip per chunk). Workers build a :class:`Batch` with the ``add_*`` methods so
acks and the next claim share one round trip.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from . import flows, validation
from .bulk import BulkEnqueue, Outgoing
from .claims import ClaimResult
from .commands import CompleteAck
from .core import BrokerCore
from .errors import NotReplicated, PartialClaimError
from .failover import CALL_FAILED, FAILOVER
from .fields import stored
from .keyed import OUTCOMES, KeyedOptions, Outcome
from .keys import QueueKeys
from .requests import BulkResult, EnqueueRequest, EnqueueResult
from .reservations import claim_reserved
from .scripts import Batch
from .urls import client_from_url as client_from_url  # re-exported

__all__ = ["Broker", "BulkResult", "EnqueueRequest", "EnqueueResult", "client_from_url"]


class Broker(BrokerCore):
    """Queue operations over one Redis client. Thread-safe, like the client it wraps."""

    # -- producing ----------------------------------------------------------------

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
        keyed: KeyedOptions | None = None,
        traceparent: str = "",
    ) -> EnqueueResult:
        """Enqueue one job in one round trip. A job whose id exists is not added twice.

        With ``depends_on`` the job waits for its parents (status ``waiting``; see
        :mod:`~django_delayq.engine.flows`): they are checked to exist first, then the
        job is stored and linked to them (a few round trips). ``keyed``: its concurrency
        and dedupe keys (:mod:`~django_delayq.engine.keyed`); the result's ``outcome``
        says whether a dedupe key replaced or ignored it.
        """
        deps = flows.dependencies(depends_on, queue, on_parent_failure, pass_results)
        job = self._encode(task, args, kwargs or {}, run_at, delay, priority, job_id,
                           max_attempts, timeout, arg_names, None, None, traceparent, keyed,
                           self.shard_count(queue) if keyed is not None else 1)
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
            try:
                self.remember_queue(queue)
                if wait is None:
                    reply = self.commands.enqueue(keys, (job,))
                else:
                    reply, confirmed = self.commands.enqueue_and_wait(keys, (job,), wait)
                break
            except FAILOVER as exc:
                deadline = self.retry_or_raise(exc, deadline)
        added, status, run_at_ms, enqueued_at_ms = reply[:4]
        if wait is not None and confirmed < wait[0]:
            raise NotReplicated([job.job_id], confirmed, *wait)
        outcome = OUTCOMES[int(added)]
        return EnqueueResult(reply[4] if len(reply) > 4 and reply[4] else job.job_id,
                             outcome is Outcome.CREATED, status, int(run_at_ms),
                             int(enqueued_at_ms), outcome)

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
            except CALL_FAILED as exc:
                failure = exc
        for queue, shards in reserving.items():
            try:
                results += claim_reserved(self, queue, [keys for keys, _ in shards],
                                          max(count for _, count in shards), worker, lease_ms)
            except PartialClaimError as exc:
                results += exc.results
                failure = failure or exc.__cause__ or exc
            except CALL_FAILED as exc:
                failure = failure or exc
        if failure is not None:
            if results:
                raise PartialClaimError(results, len(wants) - len(results)) from failure
            raise failure
        return results

    def answers(self) -> bool:
        """Whether Redis answers a PING now (after a call failed: was it refused, or is
        Redis out of reach?)."""
        try:
            return bool(self.client.ping())
        except CALL_FAILED:
            return False

    def add_start(
        self, batch: Batch, keys: QueueKeys, worker: str, started: Sequence[tuple[str, int, int]]
    ) -> int:
        """Add a note that ``(job_id, attempt, start ms)`` claimed jobs started running."""
        return self.commands.add_start(batch, keys, worker, started)

    def add_complete(
        self, batch: Batch, keys: QueueKeys,
        done: Sequence[CompleteAck],
    ) -> int:
        """Add acks of ``(job_id, attempt, result_json[, start ms[, run ms]])`` on the
        shard ``keys`` (the start time, for the attempt log, when the job's own is not
        recorded; the run time as the worker measured it, for the duration histogram)."""
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

    def reclaim_worker(self, worker: str, shards: Sequence[QueueKeys],
                       page: int = 1_000) -> tuple[int, int]:
        """Hand back every lease ``worker`` holds on ``shards`` now, whatever its
        deadline (its process ended): (returned to ready, dead-lettered). Jobs it had
        not started go back with their attempt uncounted."""
        returned = dead = 0
        ranks = dict.fromkeys(shards, 0)
        while ranks:
            batch = self.batch()
            for keys, rank in ranks.items():
                self.commands.add_reclaim(batch, keys, page, self.config.lease_ms,
                                          worker, rank)
            with self.connection_errors():
                replies = batch.run()
            for (keys, _), reply in zip(list(ranks.items()), replies, strict=True):
                returned, dead = returned + int(reply[0]), dead + int(reply[1])
                if int(reply[4]) < 0:
                    del ranks[keys]
                else:
                    ranks[keys] = int(reply[4])
        return returned, dead

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
