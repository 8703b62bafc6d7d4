"""The :class:`Worker`: claims jobs in batches, runs them on threads, acks in batches.

Threads of one :class:`Worker`:

- the *fetcher* claims up to the free capacity from every served queue shard in one
  round trip, and when nothing is due blocks on the queues' marker ZSETs (BZPOPMIN)
  until work arrives or the next scheduled job is due (Redis clock);
- *executors* (``concurrency`` of them) run jobs, with Django's
  ``close_old_connections()`` around each;
- the *acker* sends every finished job's outcome in one round trip per batch;
- the *heartbeat* extends the leases of held jobs, reclaims expired leases of dead
  workers, and records this worker as alive;
- the *scheduler* (only with periodic tasks on the served queues, not in burst mode)
  enqueues their upcoming occurrences ahead of time (see :mod:`django_delayq.periodic`).

``run()`` blocks until :meth:`Worker.request_stop` (or, with ``burst``, until nothing is
due), then stops claiming, hands back claimed jobs that have not started, lets running
jobs finish within the grace period and returns an exit code. Signals are the
management command's business, not the worker's.
"""

from __future__ import annotations

import logging
import os
import queue as stdlib_queue
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from redis.exceptions import RedisError

from ..backoff import Backoff
from ..conf import conf
from ..connection import get_broker
from ..engine import Broker, ClaimedJob, ClaimResult, PartialClaimError, QueueKeys
from ..engine.reservations import claim_reserved
from ..markers import MarkerWatch
from ..periodic import schedule_due
from ..task import TaskRegistry, registry
from .acks import by_shard, send_outcomes
from .execution import Outcome, execute
from .liveness import forget, record_alive

logger = logging.getLogger("django_delayq.worker")

#: Exit codes of ``run()`` (and of ``manage.py runworker``).
EXIT_OK = 0
EXIT_FORCED = 1

#: Seconds below which the fetcher waits for a due job on its own clock: Redis checks
#: blocking timeouts only every 1/hz s (100 ms by default), too coarse for a due time.
PRECISE_WAIT = 0.25
#: Pauses between retries while Redis is unreachable: the first, and the longest.
FIRST_BACKOFF = 0.1
MAX_BACKOFF = 5.0
#: A shard that refuses a claim its siblings answered (a Redis Cluster slot on the move
#: says TRYAGAIN) is left out of claims for this long, so the others run at full speed.
SHARD_PAUSE = 1.0
#: Adaptive prefetch holds about this many seconds of work per thread, up to MAX_PREFETCH.
PREFETCH_WINDOW = 0.05
MAX_PREFETCH = 500
#: The acker lingers this long for more outcomes when fewer than ACK_BATCH are pending
#: and jobs are still running: one round trip and one script call then ack many jobs.
ACK_LINGER = 0.002
ACK_BATCH = 64
#: A thread idle longer than this checks Django's connections (close_old_connections)
#: before its next job too, not only after each job (CONN_MAX_AGE may have passed).
IDLE_CONNECTION_CHECK = 1.0


class Worker:
    """Runs jobs of the given queues (default: every queue with registered tasks)."""

    def __init__(
        self,
        queues: Sequence[str] | None = None,
        *,
        concurrency: int | None = None,
        burst: bool = False,
        lease: float | None = None,
        grace_period: float | None = None,
        block_timeout: float | None = None,
        prefetch: int | None = None,
        broker: Broker | None = None,
        blocking_broker: Broker | None = None,
        tasks: TaskRegistry | None = None,
        name: str | None = None,
    ) -> None:
        self.tasks = tasks or registry
        self.queues = list(queues or self.tasks.queues() or [conf.DEFAULT_QUEUE])
        self.concurrency = concurrency or conf.CONCURRENCY
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.burst = burst
        self.lease_ms = int((lease or conf.LEASE) * 1000)
        self.grace_period = conf.GRACE_PERIOD if grace_period is None else grace_period
        self.block_timeout = block_timeout or conf.BLOCK_TIMEOUT
        #: Jobs claimed beyond the free threads; None adapts it to how long jobs take.
        self.prefetch = prefetch
        self.broker = broker or get_broker()
        self.blocking_broker = blocking_broker or (
            get_broker(socket_timeout=self.block_timeout + conf.SOCKET_TIMEOUT)
            if broker is None else broker
        )
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.shards: list[QueueKeys] = [k for q in self.queues for k in self.broker.shards(q)]

        self.processed = 0
        self.failed = 0
        self._stop = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._capacity = threading.Condition(self._lock)
        self._busy = 0  # claimed and not yet finished running
        self._held: dict[tuple[QueueKeys, str], ClaimedJob] = {}  # leased until acked
        self._running: set[tuple[QueueKeys, str]] = set()
        self._finished: set[tuple[QueueKeys, str]] = set()  # ran, ack not yet confirmed
        self._inbox: stdlib_queue.SimpleQueue[ClaimedJob | None] = stdlib_queue.SimpleQueue()
        self._outcomes: list[Outcome] = []
        self._outcome_ready = threading.Event()
        self._rotation = 0
        self._paused_shards: dict[QueueKeys, float] = {}  # refused a claim: until when
        self._paused_acks: dict[QueueKeys, float] = {}  # refused acks: until when
        self._watch: MarkerWatch | None = None
        if self.blocking_broker.is_cluster and len({k.tag for k in self.shards}) > 1:
            self._watch = MarkerWatch(self.blocking_broker.client,
                                      [k.marker for k in self.shards], self._stop)
        self._avg_run_time = PREFETCH_WINDOW  # moving average of job run time, seconds
        # Jobs of rate-limited and interval queues are claimed only for idle threads, so
        # each starts when claimed: the limit counts real starts, not prefetched jobs.
        self._limited = {q for q in self.queues if self.broker.rate_limit(q) is not None}
        self._starved = False  # the last claim skipped limited queues: no idle thread
        if self.prefetch is None and self._limited == set(self.queues):
            self.prefetch = 0

    # -- control ------------------------------------------------------------------

    def request_stop(self) -> None:
        """Stop claiming; ``run()`` then finishes running jobs and returns."""
        if not self._stop.is_set():
            logger.info("worker stopping worker=%s", self.name)
        self._stop.set()
        with self._capacity:
            self._capacity.notify_all()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self) -> int:
        """Run until stopped; returns :data:`EXIT_OK` or :data:`EXIT_FORCED`."""
        logger.info("worker started worker=%s queues=%s concurrency=%d", self.name,
                    ",".join(self.queues), self.concurrency)
        self._register_queues()
        executors = [threading.Thread(target=self._execute_loop, name=f"delayq-exec-{i}",
                                      daemon=True) for i in range(self.concurrency)]
        acker = threading.Thread(target=self._ack_loop, name="delayq-acker", daemon=True)
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="delayq-heartbeat",
                                     daemon=True)
        fetcher = threading.Thread(target=self._fetch_loop, name="delayq-fetcher", daemon=True)
        threads = [*executors, acker, heartbeat, fetcher]
        periodic = [] if self.burst else self.tasks.periodic(self.queues)
        if periodic:
            threads.append(threading.Thread(target=self._schedule_loop, args=(periodic,),
                                            name="delayq-scheduler", daemon=True))
        for thread in threads:
            thread.start()
        self._stop.wait()
        fetcher.join()
        code = self._shutdown(executors)
        self._done.set()
        acker.join(timeout=10)
        heartbeat.join(timeout=10)
        forget(self.broker, self.name)
        logger.info("worker stopped worker=%s processed=%d failed=%d", self.name,
                    self.processed, self.failed)
        return code

    def _shutdown(self, executors: list[threading.Thread]) -> int:
        """Hand back unstarted jobs, give running ones the grace period, flush acks."""
        unstarted: list[ClaimedJob] = []
        while True:
            try:
                job = self._inbox.get_nowait()
            except stdlib_queue.Empty:
                break
            if job is not None:
                unstarted.append(job)
        for _ in executors:
            self._inbox.put(None)
        if unstarted:
            self._release(unstarted, started=False)
        deadline = time.monotonic() + self.grace_period
        for thread in executors:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        self._flush_acks_until_done(deadline + 5)
        with self._lock:
            leftover = [self._held[k] for k in self._running if k in self._held]
        if leftover:
            logger.warning("grace period over, handing back %d running jobs worker=%s",
                           len(leftover), self.name)
            self._release(leftover, started=True)
            return EXIT_FORCED
        return EXIT_OK

    # -- fetching -----------------------------------------------------------------

    def _prefetch(self) -> int:
        """Jobs to hold beyond the free threads.

        Adaptive by default: about PREFETCH_WINDOW seconds of work per thread, so fast
        jobs are claimed in large batches (few round trips) while slow jobs are not
        hoarded by one worker when others are idle.
        """
        if self.prefetch is not None:
            return self.prefetch
        per_thread = PREFETCH_WINDOW / max(self._avg_run_time, 1e-5)
        return max(self.concurrency, min(MAX_PREFETCH, int(self.concurrency * per_thread)))

    def _free_slots(self) -> int:
        return self.concurrency + self._prefetch() - self._busy

    @property
    def _low_water(self) -> int:
        """The fetcher claims again once this many slots are free: batches, not single jobs."""
        prefetch = self._prefetch()
        return max(1, min(prefetch, (self.concurrency + prefetch) // 2))

    def _fetch_loop(self) -> None:
        backoff = Backoff(self._stop, first=FIRST_BACKOFF, cap=MAX_BACKOFF)
        while not self._stop.is_set():
            with self._capacity:
                while (not self._stop.is_set() and self._busy
                       and self._free_slots() < self._low_water):
                    self._capacity.wait()
                free = self._free_slots()
            if self._stop.is_set():
                break
            try:
                claimed, wait = self._claim(free)
                backoff.reset()
            except RedisError as exc:
                logger.warning("redis unavailable, retrying in %.1fs worker=%s error=%s",
                               backoff.delay, self.name, exc)
                backoff.wait()
                continue
            except Exception:
                # A reply this worker cannot read must not end the fetcher (the worker
                # would live on without claiming): jobs of the lost reply are leased and
                # come back when their leases lapse.
                logger.exception("claim failed, retrying in %.1fs worker=%s", backoff.delay,
                                 self.name)
                backoff.wait()
                continue
            if claimed:
                continue
            if self.burst:
                with self._capacity:
                    idle = self._busy == 0
                if idle:
                    logger.info("burst done worker=%s", self.name)
                    self.request_stop()
                    break
                with self._capacity:
                    if self._busy:
                        self._capacity.wait(timeout=0.5)
                continue
            try:
                self._wait_for_work(wait)
            except RedisError as exc:
                logger.warning("redis unavailable while idle worker=%s error=%s", self.name, exc)
                backoff.wait()

    def _claim(self, free: int) -> tuple[int, float]:
        """Claim up to about ``free`` jobs over all shards, fairly, in one round trip.

        Shards are asked in a rotating order. A limited queue sharded over a cluster
        reserves its starts first (``engine.reservations``: more round trips).
        Returns (jobs claimed, seconds until the next scheduled job is due or the next
        start a rate limit allows, capped).
        """
        n = len(self.shards)
        start = self._rotation % n
        self._rotation += 1
        order = self.shards[start:] + self.shards[:start]
        reserving = [q for q in self.queues if self.broker.reserves_starts(q)]
        sent = time.monotonic()
        paused = self._paused_shards
        plain = [k for k in order if k.queue not in reserving and paused.get(k, 0.0) <= sent]
        with self._capacity:
            idle = max(0, self.concurrency - self._busy)
        self._starved = idle == 0 and bool(self._limited)
        results: list[ClaimResult] = []
        # A shard that fails (a cluster slot on the move) must not cost the jobs the
        # others leased: they run, and it sits out claims for SHARD_PAUSE. A failure of
        # the reservation path is raised afterwards, for the fetcher's backoff.
        failure: RedisError | None = None
        if plain:
            per_shard = max(1, -(-free // len(plain)))
            batch = self.broker.batch()
            for keys in plain:
                # a count of 0 still promotes due jobs and reports the next due time
                count = min(per_shard, idle) if keys.queue in self._limited else per_shard
                self.broker.add_claim(batch, keys, count, self.name, self.lease_ms)
            try:
                results = self.broker.run_claims(batch, plain)
            except PartialClaimError as exc:
                results = exc.results
                answered = {r.keys for r in results}
                refused = [k for k in plain if k not in answered]
                for keys in refused:
                    paused[keys] = sent + SHARD_PAUSE
                logger.warning("claim refused by %d shard(s), left out for %.1fs worker=%s "
                               "shards=%s error=%s", len(refused), SHARD_PAUSE, self.name,
                               ",".join(k.tag for k in refused), exc.__cause__)
            for result in results:
                paused.pop(result.keys, None)
        for queue in reserving:
            try:
                results += claim_reserved(
                    self.broker, queue, [k for k in order if k.queue == queue], idle,
                    self.name, self.lease_ms,
                )
            except PartialClaimError as exc:
                results += exc.results
                failure = failure or exc
            except RedisError as exc:
                failure = failure or exc
        wait = self.block_timeout
        if paused:
            wait = min(wait, min(paused.values()) - sent)
        total = 0
        for result in results:
            keys = result.keys
            if result.orphans:
                logger.warning("dropped %d job ids with no job data queue=%s",
                               result.orphans, keys.queue)
            if result.next_due_ms is not None and not result.paused:
                wait = min(wait, (result.next_due_ms - result.now_ms) / 1000)
            if result.limit_wait_ms is not None:
                wait = min(wait, result.limit_wait_ms / 1000)
            if not result.jobs:
                continue
            total += len(result.jobs)
            with self._capacity:
                self._busy += len(result.jobs)
                for job in result.jobs:
                    self._held[(job.keys, job.id)] = job
            for job in result.jobs:
                self._inbox.put(job)
        if failure is not None:
            raise failure
        return total, wait - (time.monotonic() - sent)

    def _wait_for_work(self, wait: float) -> None:
        """Sleep until work may be there: a marker, the next due time, or the cap.

        On a Redis Cluster one BZPOPMIN cannot watch keys of several slots, so each
        shard's marker is watched by its own thread (:class:`MarkerWatch`).
        """
        if wait <= 0:
            return
        if self._starved:
            # limited queues wait for a thread, not for a marker (which they keep set)
            with self._capacity:
                if self._busy >= self.concurrency and not self._stop.is_set():
                    self._capacity.wait(timeout=wait)
            return
        if wait <= PRECISE_WAIT:
            self._stop.wait(wait)
            return
        timeout = max(0.01, wait - PRECISE_WAIT / 2)
        if self._watch is not None:
            self._watch.wait(timeout)
            return
        markers = [keys.marker for keys in self.shards]
        self.blocking_broker.client.bzpopmin(markers, timeout=timeout)

    # -- executing ----------------------------------------------------------------

    def _execute_loop(self) -> None:
        last_done: float | None = None  # when this thread's previous job ended
        while True:
            job = self._inbox.get()
            if job is None:
                return
            key = (job.keys, job.id)
            with self._lock:
                self._running.add(key)
            began = time.perf_counter()
            try:
                # Django's connections were checked as the previous job ended; check
                # again first only if they may have aged or broken while this thread idled.
                idled = last_done is None or began - last_done > IDLE_CONNECTION_CHECK
                outcome = execute(job, self.tasks, self.broker.config.json_encoder,
                                  self.name, check_connections=idled)
            finally:
                last_done = time.perf_counter()
                took = last_done - began
                with self._capacity:
                    self._avg_run_time += (took - self._avg_run_time) * 0.05
                    self._running.discard(key)
                    self._busy -= 1
                    if self._free_slots() >= self._low_water or not self._busy:
                        self._capacity.notify()
            self._finish(outcome)

    def _finish(self, outcome: Outcome) -> None:
        """Queue ``outcome`` for the acker."""
        with self._lock:
            self._outcomes.append(outcome)
            self._finished.add((outcome.job.keys, outcome.job.id))
        self._outcome_ready.set()

    # -- acking -------------------------------------------------------------------

    def _ack_loop(self) -> None:
        backoff = Backoff(self._done, first=FIRST_BACKOFF, cap=MAX_BACKOFF)
        while not self._done.is_set():
            if self._outcome_ready.wait(timeout=self._ack_wait()) and self._busy and (
                    len(self._outcomes) < ACK_BATCH):
                self._done.wait(ACK_LINGER)
            try:
                self._flush_acks()
                backoff.reset()
            except RedisError as exc:
                logger.warning("acks not sent, retrying in %.1fs worker=%s error=%s",
                               backoff.delay, self.name, exc)
                backoff.wait()
        self._flush_acks_until_done(time.monotonic() + 5)

    def _ack_wait(self) -> float:
        """Seconds the acker may wait for outcomes: less if a paused shard's acks are due."""
        until = min(self._paused_acks.values(), default=None)
        return 0.5 if until is None else min(0.5, max(0.0, until - time.monotonic()))

    def _flush_acks(self, *, ignore_pauses: bool = False) -> None:
        """Send every pending outcome in one round trip (kept for a retry on failure).

        A shard that refuses its acks while others take theirs (a Redis Cluster slot on
        the move says TRYAGAIN) keeps its outcomes back for SHARD_PAUSE; the other
        shards' acks go on landing meanwhile. If every call is refused, or the round
        trip fails, the error is raised for the acker's backoff.
        """
        now = time.monotonic()
        paused = self._paused_acks
        with self._lock:
            pending, self._outcomes = self._outcomes, []
            self._outcome_ready.clear()
        for keys, until in list(paused.items()):
            if until <= now or ignore_pauses:
                paused.pop(keys, None)
        outcomes, held_back = pending, []
        if paused:
            outcomes = [o for o in pending if o.job.keys not in paused]
            held_back = [o for o in pending if o.job.keys in paused]
        if not outcomes:
            self._keep_outcomes(held_back)
            return
        try:
            sent = send_outcomes(self.broker, outcomes)
        except RedisError:
            self._keep_outcomes(pending)
            raise
        if sent.stale:
            logger.warning("%d acks were stale: the lease had lapsed and another attempt "
                           "owns the job worker=%s", sent.stale, self.name)
        refused = {o.job.keys for o in sent.unsent}
        unsent = {id(o) for o in sent.unsent}
        with self._lock:
            self._outcomes[:0] = sent.unsent + held_back  # only the refused calls go again
            for o in outcomes:
                if id(o) in unsent:
                    continue
                self._held.pop((o.job.keys, o.job.id), None)
                self._finished.discard((o.job.keys, o.job.id))
                if o.ok:
                    self.processed += 1
                else:
                    self.failed += 1
        if sent.error is None:
            return
        if len(sent.unsent) == len(outcomes):
            raise sent.error
        for keys in refused:
            paused[keys] = now + SHARD_PAUSE
        logger.warning("acks refused by %d shard(s), held back for %.1fs worker=%s "
                       "shards=%s error=%s", len(refused), SHARD_PAUSE, self.name,
                       ",".join(k.tag for k in refused), sent.error)

    def _keep_outcomes(self, outcomes: list[Outcome]) -> None:
        """Put ``outcomes`` back at the head of the pending ones, to send again."""
        if outcomes:
            with self._lock:
                self._outcomes[:0] = outcomes

    def _flush_acks_until_done(self, deadline: float) -> None:
        """At shutdown: send every pending outcome, paused shards' too, until ``deadline``."""
        while True:
            try:
                self._flush_acks(ignore_pauses=True)
            except RedisError as exc:
                logger.warning("acks not sent at shutdown worker=%s error=%s", self.name, exc)
            if not self._outcomes:
                return
            if time.monotonic() >= deadline:
                logger.warning("%d acks not sent at shutdown: their jobs run again once "
                               "their leases lapse worker=%s", len(self._outcomes), self.name)
                return
            time.sleep(0.2)

    # -- leases, reclaim, liveness -------------------------------------------------

    def _heartbeat_loop(self) -> None:
        interval = max(0.2, min(self.lease_ms / 3000, 10.0))
        while not self._done.wait(interval):
            try:
                self._heartbeat()
            except RedisError as exc:
                logger.warning("heartbeat failed worker=%s error=%s", self.name, exc)

    def _heartbeat(self) -> None:
        with self._lock:
            held = list(self._held.values())
        batch = self.broker.batch()
        extend_calls = [(keys, self.broker.add_extend(batch, keys, pairs, self.lease_ms))
                        for keys, pairs in by_shard(held).items()]
        reclaim_calls = [(keys, self.broker.add_reclaim(batch, keys)) for keys in self.shards]
        replies = batch.run()
        for keys, index in extend_calls:
            with self._lock:
                # A finished job's ack may have landed between the snapshot and the
                # extension: the acker settles those (and reports a stale ack).
                lost = [job_id for job_id in replies[index]
                        if (keys, job_id) not in self._finished]
                for job_id in lost:
                    self._held.pop((keys, job_id), None)
            if lost:
                logger.warning("lease lost for %d jobs queue=%s jobs=%s worker=%s", len(lost),
                               keys.queue, ",".join(lost[:10]), self.name)
        for keys, index in reclaim_calls:
            returned, dead = replies[index]
            if returned or dead:
                logger.warning("reclaimed expired leases queue=%s returned=%s dead_lettered=%s",
                               keys.queue, returned, dead)
        self._record_alive()

    def _schedule_loop(self, periodic: list[Any]) -> None:
        """Enqueue upcoming occurrences of periodic tasks, a few times per lookahead."""
        lookahead = conf.CRON_LOOKAHEAD
        interval = max(0.2, min(10.0, lookahead / 3))
        logger.info("scheduling periodic tasks worker=%s tasks=%s", self.name,
                    ",".join(f"{t.name}({t.schedule.describe()})" for t in periodic))
        while not self._stop.is_set():
            try:
                added = schedule_due(self.broker, periodic, lookahead_ms=int(lookahead * 1000),
                                     missed=conf.CRON_MISSED,
                                     catch_up_max=conf.CRON_CATCH_UP_MAX)
                if added:
                    logger.debug("enqueued %d periodic jobs worker=%s", added, self.name)
            except RedisError as exc:
                logger.warning("periodic scheduling failed worker=%s error=%s", self.name, exc)
            self._stop.wait(interval)

    def _register_queues(self) -> None:
        try:
            self.broker.client.sadd(self.broker.global_keys.queues, *self.queues)
            self._record_alive()
        except RedisError as exc:
            logger.warning("could not register worker worker=%s error=%s", self.name, exc)

    def _record_alive(self) -> None:
        record_alive(self.broker, self.name, max(60, int(self.lease_ms / 1000 * 3)), {
            "queues": ",".join(self.queues), "concurrency": self.concurrency,
            "processed": self.processed, "failed": self.failed, "busy": self._busy,
        })

    def _release(self, jobs: list[ClaimedJob], *, started: bool) -> None:
        batch = self.broker.batch()
        for keys, pairs in by_shard(jobs).items():
            self.broker.add_release(batch, keys, pairs, started=started)
        try:
            batch.run()
        except RedisError as exc:
            logger.warning("could not hand back %d jobs (their leases will lapse) error=%s",
                           len(jobs), exc)
            return
        with self._lock:
            for job in jobs:
                self._held.pop((job.keys, job.id), None)
        logger.info("handed back %d jobs worker=%s", len(jobs), self.name)

