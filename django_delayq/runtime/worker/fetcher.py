"""The fetcher: claims jobs for the worker's free threads and buffer, in batches.

It claims up to the free capacity in one round trip (:meth:`Broker.claim_many`), from
every served queue shard or, while shards have a backlog, from one of them at a time
(:meth:`Fetcher.claim`), and when nothing is due blocks on the queues' marker ZSETs
(BZPOPMIN) until work arrives or the next scheduled job is due (Redis clock).

A worker has a fetcher per *lane* (:mod:`.ledger`): one claims for its threads
(capacity ``concurrency + prefetch``), one, when it serves queues whose tasks are all
``async def``, for its event loop (capacity: the loop's slots, no prefetch, so no job
waits for a slot that is not there). Each counts every lease of its lane the ledger holds
until its ack lands: the jobs one worker holds unacked, and so what its death can make
run twice, never exceed the sum.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence

from ...engine import Broker, ClaimedJob, ClaimResult, PartialClaimError, QueueKeys, markers
from ...engine.logfields import log
from ...engine.markers import wait_for_mark
from ..backoff import CALL_FAILED, FIRST_BACKOFF, MAX_BACKOFF, SHARD_BACKOFF, Backoff
from .ledger import THREADS, Ledger
from .markers import MarkerWatch

logger = logging.getLogger("django_delayq.worker")

#: Seconds below which the fetcher waits for a due job on its own clock: Redis checks
#: blocking timeouts only every 1/hz s (100 ms by default), too coarse for a due time.
PRECISE_WAIT = 0.25
#: Adaptive prefetch holds about this many seconds of work per thread, up to MAX_PREFETCH.
PREFETCH_WINDOW = 0.05
MAX_PREFETCH = 500
#: While shards with a backlog are claimed from one at a time, the quiet ones (no
#: backlog) are asked for a job at least this often, in seconds: the longest a job
#: arriving on a quiet shard waits for a claim while the worker keeps claiming.
QUIET_SHARD_INTERVAL = 0.05


class Fetcher:
    """Claims jobs into the ledger and hands them to ``deliver`` (the executors)."""

    def __init__(
        self,
        *,
        broker: Broker,
        blocking_broker: Broker,
        queues: Sequence[str],
        name: str,
        lease_ms: int,
        block_timeout: float,
        concurrency: int,
        prefetch: int | None,
        burst: bool,
        ledger: Ledger,
        deliver: Callable[[ClaimedJob], None],
        stop: threading.Event,
        on_burst_done: Callable[[str, int], bool],
        lane: str = THREADS,
        min_batch: int = 1,
        ack_room: int = 0,
        held_back: Callable[[], bool] = lambda: False,
    ) -> None:
        self.broker = broker
        self.blocking_broker = blocking_broker
        self.queues = list(queues)
        self.name = name
        self.lease_ms = lease_ms
        self.block_timeout = block_timeout
        self.concurrency = concurrency
        #: The ledger's lane whose leases this fetcher claims and counts.
        self.lane = lane
        #: Free slots below which it waits rather than claim (when prefetch is 0).
        self.min_batch = min_batch
        #: Leases held beyond the capacity while their acks are on the way: a job that
        #: finished frees its slot for a claim at once, not when its ack lands (0: it
        #: frees it then).
        self.ack_room = ack_room
        #: While true, nothing is claimed (an event loop that stalled).
        self._held_back = held_back
        #: Jobs claimed beyond the free threads; None adapts it to how long jobs take.
        self.prefetch = prefetch
        self.burst = burst
        self.ledger = ledger
        self._deliver = deliver
        self._stop = stop
        self._on_burst_done = on_burst_done
        self.shards: list[QueueKeys] = [k for q in self.queues for k in broker.shards(q)]
        self.rotation = 0
        #: Shards whose last claim gave all it asked: a backlog, claimed from one at a
        #: time (see :meth:`claim`), in turn from a random start so that workers started
        #: together do not all ask the same shard first.
        self._backlogged: set[QueueKeys] = set()
        self._next_focus = random.randrange(max(1, len(self.shards)))
        #: When the quiet shards were last asked (monotonic seconds).
        self._quiet_asked_at = float("-inf")
        #: Shards backing off after refusing a claim: until when (monotonic seconds).
        self._backoff_until: dict[QueueKeys, float] = {}
        #: Shards asked for a job that gave none since a claim last got one: a burst is
        #: over once every shard is among them (a round may ask some shards for none).
        self._found_empty: set[QueueKeys] = set()
        #: The ledger's settles when the shards in ``_found_empty`` began to be asked.
        self._swept_after = -1
        #: The marker a stop sets to end this fetcher's idle wait (:meth:`wake`).
        self._wake_key = markers.wake_key(self.shards[0].tag, f"{name}/{lane}")
        self.watch: MarkerWatch | None = None
        if blocking_broker.is_cluster and len({k.tag for k in self.shards}) > 1:
            self.watch = MarkerWatch(blocking_broker, [k.marker for k in self.shards],
                                     stop)
        # Jobs of rate-limited and interval queues are claimed only for idle threads, so
        # each starts when claimed: the limit counts real starts, not prefetched jobs.
        self._limited = {q for q in self.queues if broker.rate_limit(q) is not None}
        self._starved = False  # the last claim skipped limited queues: no idle thread
        if self.prefetch is None and self._limited == set(self.queues):
            self.prefetch = 0
        # A finished job frees no capacity until its ack lands (the ledger's settle wakes
        # the fetcher then); a free thread matters to limited queues (starved), to a
        # burst waiting for the last job, and to a stop waiting for running jobs.
        ledger.wake_fetcher.append(
            lambda: self._starved or not ledger.busy_in(lane) or stop.is_set() or (
                self.ack_room > 0 and self._free_slots() >= self._low_water()))

    # -- capacity -----------------------------------------------------------------

    def _prefetch(self) -> int:
        """Jobs to hold beyond the free threads.

        Adaptive by default: about PREFETCH_WINDOW seconds of work per thread, so fast
        jobs are claimed in large batches (few round trips) while slow jobs are not
        hoarded by one worker when others are idle: none before a job has run (its run
        time unknown), none once jobs take longer than PREFETCH_WINDOW times the
        threads. Workers of a pool started together so share a backlog of slow jobs.
        """
        if self.prefetch is not None:
            return self.prefetch
        average = self.ledger.avg_run_time[self.lane]
        if average is None:
            return 0
        per_thread = PREFETCH_WINDOW / max(average, 1e-5)
        return min(MAX_PREFETCH, int(self.concurrency * per_thread))

    def capacity(self) -> int:
        """The most leases this lane holds at once (acks on their way included)."""
        return self.concurrency + self._prefetch()

    def _free_slots(self) -> int:
        if self._held_back():
            return 0
        capacity = self.capacity()
        held = self.ledger.held_in(self.lane)
        if not self.ack_room:
            free = capacity - held
        else:
            free = min(capacity + self.ack_room - held,
                       capacity - self.ledger.busy_in(self.lane))
        budget = self.ledger.budget
        return free if budget is None else min(free, budget)

    def _low_water(self) -> int:
        """The fetcher claims again once this many slots are free: batches, not single
        jobs (but the last places of a claim budget, however few)."""
        prefetch = self._prefetch()
        if not prefetch:
            low = max(1, min(self.min_batch, self.concurrency))
        else:
            low = max(1, min(prefetch, (self.concurrency + prefetch) // 2))
        budget = self.ledger.budget
        return low if budget is None else max(1, min(low, budget))

    # -- the loop -----------------------------------------------------------------

    def run(self) -> None:
        backoff = Backoff(self._stop, first=FIRST_BACKOFF, cap=MAX_BACKOFF)
        ledger = self.ledger
        while not self._stop.is_set():
            with ledger.changed:
                while not self._stop.is_set() and self._free_slots() < self._low_water():
                    # held back, it looks again each second: nothing in the ledger
                    # changes when a stalled loop recovers
                    ledger.changed.wait(timeout=1.0 if self._held_back() else None)
                free = self._free_slots()
                ledger.refund(-free)  # taken from the budget now, the unused part back below
            if self._stop.is_set():
                with ledger.lock:
                    ledger.refund(free)
                break
            claimed = 0
            try:
                claimed, wait = self.claim(free)
                backoff.reset()
            except CALL_FAILED as exc:
                log(logger, logging.WARNING, "redis unavailable", retry_in_s=backoff.delay,
                    worker=self.name, error=exc)
                backoff.wait()
                continue
            except Exception:
                # A reply this worker cannot read must not end the fetcher (the worker
                # would live on without claiming): jobs of the lost reply are leased and
                # come back when their leases lapse.
                log(logger, logging.ERROR, "claim failed", exc_info=True,
                    retry_in_s=backoff.delay, worker=self.name)
                backoff.wait()
                continue
            finally:
                with ledger.lock:
                    ledger.refund(free - claimed)
            if claimed:
                continue
            if self.burst:
                with ledger.changed:
                    # done once no lane holds a job, acks included, and every lane found
                    # its shards empty after the last ack: an ack can make a dependant
                    # (or a retry without backoff) due, in any lane's queue
                    if ledger.held_count:
                        ledger.changed.wait(timeout=0.5)
                        continue
                    settles = ledger.settles
                if self._swept_after != settles:
                    self._found_empty.clear()  # found empty before that ack: ask again
                    self._swept_after = settles
                    continue
                if not self._found_empty.issuperset(self.shards):
                    continue  # the next rounds ask the shards not asked yet
                if self._on_burst_done(self.lane, settles):
                    break
                with ledger.changed:  # another lane still runs jobs: wait for its acks
                    ledger.changed.wait(timeout=0.5)
                continue
            try:
                self._wait_for_work(wait)
            except CALL_FAILED as exc:
                log(logger, logging.WARNING, "redis unavailable while idle", worker=self.name,
                    error=exc)
                backoff.wait()

    def claim(self, free: int) -> tuple[int, float]:
        """Claim up to ``free`` jobs, fairly between shards, in one round trip.

        While shards have a backlog (their last claim gave all it asked), a round asks
        one of them, in turn, for nearly all of ``free``: each script call then carries a
        whole batch, and so do the acks that follow it, so a sharded queue costs about
        what one shard does per job (a call's fixed cost is paid once per batch, not once
        per shard). The quiet shards (their last claim came back short) are asked for one
        job each along with it at least every QUIET_SHARD_INTERVAL, so a job arriving on
        one waits no longer than that; one that gives its job has a backlog again.
        Otherwise (no backlog known, the shard asked came back empty, or ``free`` too
        small to leave it a job) every shard is asked in a rotating order, ``free``
        split between them. Rate-limited queues get their share of that split in every
        round. The counts never add up to more than ``free``.

        Returns (jobs claimed, seconds until the next scheduled job is due or the next
        start a rate limit allows, capped).
        """
        self.rotation += 1
        sent = time.monotonic()
        focus = self._focus(sent)
        if focus is not None:
            ask_quiet = sent - self._quiet_asked_at >= QUIET_SHARD_INTERVAL
            wants = self._wants(free, sent, focus, ask_quiet)
            if wants is not None:
                if ask_quiet:
                    self._quiet_asked_at = sent
                try:
                    total, wait, filled = self._claim_round(wants, sent, focus)
                except CALL_FAILED:
                    # the round below asks that shard again and backs it off if it
                    # refuses while others answer, as any round does
                    self._backlogged.discard(focus)
                else:
                    if total or filled:
                        return total, wait
        self._quiet_asked_at = sent
        wants = self._wants(free, sent, None, True) or []
        total, wait, _ = self._claim_round(wants, sent, None)
        return total, wait

    def _focus(self, now: float) -> QueueKeys | None:
        """The next shard with a backlog, in turn (None: none is known)."""
        n = len(self.shards)
        for step in range(n if self._backlogged else 0):
            keys = self.shards[(self._next_focus + step) % n]
            if keys in self._backlogged and self._backoff_until.get(keys, 0.0) <= now:
                self._next_focus = (self._next_focus + step + 1) % n
                return keys
        return None

    def _wants(self, free: int, sent: float, focus: QueueKeys | None,
               ask_quiet: bool) -> list[tuple[QueueKeys, int]] | None:
        """What each shard is asked for, ``free`` in all: split over every shard that is
        not backing off (``focus`` None), or the limited queues' shares of that split,
        one job per quiet shard if ``ask_quiet``, and the rest for ``focus`` (None if
        nothing is left for it)."""
        n = len(self.shards)
        start = self.rotation % n
        order = [k for k in self.shards[start:] + self.shards[:start]
                 if self._backoff_until.get(k, 0.0) <= sent]
        idle = max(0, self.concurrency - self.ledger.busy_in(self.lane))
        self._starved = idle == 0 and bool(self._limited)
        # ``free`` split over the shards (the first ones in this turn's order get the
        # remainder), never more in all; a count of 0 still promotes due jobs and
        # reports the next due time
        each, extra = divmod(max(0, free), max(1, len(order)))
        counts = [each + (i < extra) for i in range(len(order))]
        split = [(keys, min(count, idle) if keys.queue in self._limited else count)
                 for keys, count in zip(order, counts, strict=True)]
        if focus is None:
            return split
        limited = [(keys, count) for keys, count in split if keys.queue in self._limited]
        quiet = [(keys, 1) for keys in order if ask_quiet and keys != focus
                 and keys.queue not in self._limited and keys not in self._backlogged]
        rest = free - sum(count for _, count in limited) - len(quiet)
        return [(focus, rest), *limited, *quiet] if rest >= 1 else None

    def _claim_round(self, wants: list[tuple[QueueKeys, int]], sent: float,
                     focus: QueueKeys | None) -> tuple[int, float, bool]:
        """One round trip asking each shard of ``wants`` for its count. Returns (jobs
        claimed, seconds to wait, whether ``focus`` gave all it was asked)."""
        backing_off = self._backoff_until
        results: list[ClaimResult] = []
        if wants:
            try:
                results = self.broker.claim_many(wants, self.name, self.lease_ms)
            except PartialClaimError as exc:
                # A shard that fails (a cluster slot on the move) must not cost the jobs
                # the others leased: they run, and it sits out claims for SHARD_BACKOFF.
                results = exc.results
                answered = {r.keys for r in results}
                refused = [k for k, _ in wants if k not in answered]
                for keys in refused:
                    backing_off[keys] = sent + SHARD_BACKOFF
                    self._backlogged.discard(keys)
                log(logger, logging.WARNING, "claim refused by shards, left out",
                    retry_in_s=SHARD_BACKOFF, worker=self.name,
                    shards=",".join(k.tag for k in refused), error=exc.__cause__)
        asked = dict(wants)
        filled = False
        for result in results:
            backing_off.pop(result.keys, None)
            if result.keys.queue in self._limited or asked[result.keys] < 1:
                continue  # a count of 0 says nothing of a backlog
            if len(result.jobs) >= asked[result.keys]:
                self._backlogged.add(result.keys)
                filled = filled or result.keys == focus
            else:
                self._backlogged.discard(result.keys)
        wait = self.block_timeout
        if backing_off:
            wait = min(wait, min(backing_off.values()) - sent)
        total = 0
        for result in results:
            if not result.jobs and asked[result.keys] >= 1:
                self._found_empty.add(result.keys)
            if result.orphans:
                log(logger, logging.WARNING, "dropped job ids with no job data",
                    queue=result.keys.queue, jobs=result.orphans, worker=self.name)
            if result.due_in_us is not None and not result.paused:
                wait = min(wait, result.due_in_us / 1e6)
            if result.limit_wait_ms is not None:
                wait = min(wait, result.limit_wait_ms / 1000)
            if not result.jobs:
                continue
            total += len(result.jobs)
            self._found_empty.clear()
            self.ledger.add(result.jobs, self.lane)
            for job in result.jobs:
                self._deliver(job)
        return total, wait - (time.monotonic() - sent), filled

    def _wait_for_work(self, wait: float) -> None:
        """Sleep until work may be there: a marker, the next due time, or the cap.

        On a Redis Cluster one BZPOPMIN cannot watch keys of several slots, so each
        shard's marker is watched by its own thread (:class:`MarkerWatch`).
        """
        if wait <= 0:
            return
        if self._starved:
            # limited queues wait for a thread, not for a marker (which they keep set)
            with self.ledger.changed:
                if (self.ledger.busy_in(self.lane) >= self.concurrency
                        and not self._stop.is_set()):
                    self.ledger.changed.wait(timeout=wait)
            return
        if wait <= PRECISE_WAIT:
            self._stop.wait(wait)
            return
        timeout = max(0.01, wait - PRECISE_WAIT / 2)
        if self.watch is not None:
            self.watch.wait(timeout)
            return
        wait_for_mark(self.blocking_broker,
                      [*(keys.marker for keys in self.shards), self._wake_key], timeout)

    def wake(self) -> None:
        """End an idle wait now (the worker stops): it need not last its timeout."""
        if self.watch is not None:
            self.watch.wake()
            return
        try:
            markers.wake(self.broker, self._wake_key)
        except CALL_FAILED as exc:  # the wait ends by itself, within its timeout
            log(logger, logging.DEBUG, "could not wake the fetcher", worker=self.name,
                error=exc)

