"""Sending the outcomes of finished jobs: every pending ack in one round trip."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ...engine import AckRefused, Broker, ClaimedJob, QueueKeys, flows
from ...engine.failover import is_transient
from ...engine.logfields import log
from ..backoff import CALL_FAILED, FIRST_BACKOFF, MAX_BACKOFF, SHARD_BACKOFF, Backoff
from .ledger import Ledger
from .outcome import Outcome, failure

logger = logging.getLogger("django_delayq.worker")

#: The acker lingers this long for more outcomes when fewer than ACK_BATCH are pending
#: and jobs are still running: one round trip and one script call then ack many jobs.
ACK_LINGER = 0.002
ACK_BATCH = 64
#: An outcome carrying more than this (result, error and traceback) is acked in a round
#: trip of its own, after the others: a server that refuses it (over its
#: proto-max-bulk-len, which is at least 1 MB) drops the connection, and with it every
#: ack of the round trip.
LARGE_ACK = 256 * 1024
#: Round trips an ack sent alone (a large one, or one of a batch Redis refused) may fail
#: while Redis answers before its job is failed without its payload (AckRefused).
LARGE_ACK_TRIES = 2


def by_shard(jobs: Iterable[ClaimedJob]) -> dict[QueueKeys, list[tuple[str, int]]]:
    """``(job id, attempt)`` pairs grouped by the shard holding each job."""
    grouped: dict[QueueKeys, list[tuple[str, int]]] = {}
    for job in jobs:
        grouped.setdefault(job.keys, []).append((job.id, job.attempt))
    return grouped


@dataclass(slots=True)
class SentAcks:
    """What became of a round trip of acks."""

    #: Acks the engine ignored: the lease had lapsed and another attempt owns the job.
    stale: int = 0
    #: Outcomes whose call failed (its shard refused it): to send again.
    unsent: list[Outcome] = field(default_factory=list)
    #: The first of those failures.
    error: Exception | None = None
    #: Of the unsent, those whose call failed for what it carried, not for want of Redis
    #: (:func:`~...engine.failover.is_transient`): each goes alone next.
    refused: list[Outcome] = field(default_factory=list)
    #: What became of each landed outcome, by ``id(outcome)``: completed, retried,
    #: failed (for good) or stale.
    fates: dict[int, str] = field(default_factory=dict)
    #: With MIN_REPLICAS_ACKS: replicas that confirmed the acks, when fewer than asked
    #: (the acks are on the primary; a failover before a replica has them re-runs
    #: those jobs: duplicates, never losses).
    short_replicas: int | None = None
    #: Shards whose acks left releases of dependants in other shards in their outbox.
    outboxes: set[QueueKeys] = field(default_factory=set)


def send_outcomes(broker: Broker, outcomes: Sequence[Outcome], *, worker: str = "",
                  started: Sequence[tuple[ClaimedJob, int]] = ()) -> SentAcks:
    """Ack ``outcomes`` in one round trip: completions batched per shard, failures each.

    A call that fails (a Redis Cluster shard whose slot is moving answers TRYAGAIN) only
    leaves its own outcomes unsent; the others landed and are not sent twice. If the
    round trip itself fails, the Redis error propagates and nothing is known to have
    landed: the caller keeps every outcome to send again (an ack that did land is then
    ignored as stale, never applied twice).
    """
    batch = broker.batch()
    # Start notes go first: a job that started and finished since the last round trip
    # is marked active with its start time before its ack lands.
    starts: dict[QueueKeys, list[tuple[str, int, int]]] = {}
    for job, start_ms in started:
        starts.setdefault(job.keys, []).append((job.id, job.attempt, start_ms))
    for keys, notes in starts.items():
        broker.add_start(batch, keys, worker, notes)
    completes: dict[QueueKeys, list[Outcome]] = {}
    calls: list[tuple[int, list[Outcome]]] = []
    for o in outcomes:
        if o.ok:
            completes.setdefault(o.job.keys, []).append(o)
        else:
            calls.append((broker.add_fail(batch, o.job.keys, o.job.id, o.job.attempt,
                                          o.error, o.traceback, o.retry_delay_ms,
                                          o.started_ms), [o]))
    for keys, done in completes.items():
        index = broker.add_complete(batch, keys,
                                    [(o.job.id, o.job.attempt, o.result_json, o.started_ms,
                                      run_ms(o)) for o in done])
        calls.append((index, done))
    wait = broker.replica_wait() if broker.config.min_replicas_acks else None
    replies = batch.run(raise_on_error=False, wait=wait)
    sent = SentAcks()
    if wait is not None and batch.confirmed is not None and batch.confirmed < wait[0]:
        sent.short_replicas = batch.confirmed
    for index, sent_outcomes in calls:
        reply = replies[index]
        if isinstance(reply, Exception):
            sent.unsent += sent_outcomes
            sent.error = sent.error or reply
            if not is_transient(reply):
                sent.refused += sent_outcomes
        elif sent_outcomes[0].ok:
            for o, flag in zip(sent_outcomes, reply, strict=True):
                sent.fates[id(o)] = "completed" if flag else "stale"
                if flag == 2:
                    sent.outboxes.add(o.job.keys)
            sent.stale += list(reply).count(0)
        else:
            sent.fates[id(sent_outcomes[0])] = reply[0]
            if reply[0] == "stale":
                sent.stale += 1
            elif len(reply) > 2 and int(reply[2]):
                sent.outboxes.add(sent_outcomes[0].job.keys)
    return sent


def run_ms(o: Outcome) -> int:
    """How long the job ran (ms), as measured here, for the duration histogram; -1 when
    unknown. Not the time to the ack: the outcome may wait for it."""
    return max(0, o.finished_ms - o.started_ms) if o.finished_ms else -1


def payload_size(o: Outcome) -> int:
    """Bytes (about) an outcome's ack carries: its result, error and traceback."""
    return len(o.result_json) + len(o.error) + len(o.traceback)


def log_finished(o: Outcome, fate: str, worker: str) -> None:
    """The one record of a finished job (INFO; WARNING when retried, ERROR when failed)."""
    job = o.job
    level = {"completed": logging.INFO, "failed": logging.ERROR}.get(fate, logging.WARNING)
    log(logger, level, f"job {fate}", job=job.id, task=job.task, queue=job.queue,
        attempt=job.attempt, max_attempts=job.max_attempts,
        duration_ms=max(0, o.finished_ms - o.started_ms), outcome=fate, worker=worker,
        error=o.error or None)


class Acker:
    """The acker thread's state: outcomes waiting to be sent, shards whose acks are
    deferred (backing off), and the totals of what landed.

    It sends every finished job's outcome in one round trip per batch, lingering
    briefly for more while jobs run, and settles the acked jobs in the ledger.
    """

    def __init__(self, *, broker: Broker, name: str, ledger: Ledger,
                 done: threading.Event) -> None:
        self.broker = broker
        self.name = name
        self.ledger = ledger
        self._done = done
        self._lock = threading.Lock()
        self.outcomes: list[Outcome] = []
        #: Jobs a thread started, with their start (ms), to mark active (start.lua).
        self.started: list[tuple[ClaimedJob, int]] = []
        self._ready = threading.Event()
        #: Shards backing off after refusing acks: until when (monotonic seconds).
        self._backoff_until: dict[QueueKeys, float] = {}
        #: Acked outcomes: completed jobs, failed attempts to be retried, jobs failed
        #: for good (dead-lettered), aborted jobs (ended cancelled), and acks the engine
        #: ignored as stale.
        self.completed = 0
        self.retried = 0
        self.failed = 0
        self.cancelled = 0
        self.stale = 0
        #: Acks sent alone refused so far, by ``id(outcome)``: tries failed while Redis
        #: answered.
        self._refused: dict[int, int] = {}
        #: Outcomes of a round trip that failed for what it carried, not for want of
        #: Redis (a value the client cannot encode, a script's error): each goes alone,
        #: so one that always fails cannot hold back the others. By ``id(outcome)``.
        self._alone: set[int] = set()

    def put(self, outcome: Outcome) -> None:
        """Queue ``outcome`` to be sent."""
        with self._lock:
            self.outcomes.append(outcome)
            self._signal()

    def note_started(self, job: ClaimedJob, start_ms: int) -> None:
        """Queue the note that a thread started ``job`` (sent with the next acks)."""
        with self._lock:
            self.started.append((job, start_ms))
            self._signal()

    def _signal(self) -> None:
        """Wake the acker for what was just queued (call under the lock). :meth:`flush`
        takes the queues and clears the event under the same lock, so an event still set
        means a flush to come takes this too: setting it again (a lock and a notify, two
        per job) is skipped."""
        if not self._ready.is_set():
            self._ready.set()

    def wake(self) -> None:
        """Look at the outcomes, and at whether the worker is done, now."""
        self._ready.set()

    def run(self) -> None:
        backoff = Backoff(self._done, first=FIRST_BACKOFF, cap=MAX_BACKOFF)
        while not self._done.is_set():
            if self._ready.wait(timeout=self._wait()) and self.ledger.busy and (
                    len(self.outcomes) < ACK_BATCH):
                self._done.wait(ACK_LINGER)
            try:
                self.flush()
                backoff.reset()
            except CALL_FAILED as exc:
                log(logger, logging.WARNING, "acks not sent", retry_in_s=backoff.delay,
                    worker=self.name, error=exc)
                backoff.wait()
            except Exception as exc:  # a bug, or a reply not understood: kept, tried again
                log(logger, logging.ERROR, "acks not sent: unexpected error", exc_info=True,
                    retry_in_s=backoff.delay, worker=self.name, error=exc)
                backoff.wait()
        self.flush_until_done(time.monotonic() + 5)

    def _wait(self) -> float:
        """Seconds to wait for outcomes: less if a shard's deferred acks are due."""
        until = min(self._backoff_until.values(), default=None)
        return 0.5 if until is None else min(0.5, max(0.0, until - time.monotonic()))

    def flush(self, *, ignore_backoff: bool = False) -> None:
        """Send every pending outcome in one round trip (kept for a retry on failure).

        A shard that refuses its acks while others take theirs (a Redis Cluster slot on
        the move says TRYAGAIN) has its outcomes deferred for SHARD_BACKOFF; the other
        shards' acks go on landing meanwhile. If every call is refused, or the round
        trip fails, the error is raised for the acker's backoff.
        """
        now = time.monotonic()
        backing_off = self._backoff_until
        with self._lock:
            pending, self.outcomes = self.outcomes, []
            started, self.started = self.started, []
            self._ready.clear()
        if started and pending:
            # a job that also finished is marked started by its ack (it carries the start)
            acked = {(o.job.keys, o.job.id, o.job.attempt) for o in pending}
            started = [s for s in started
                       if (s[0].keys, s[0].id, s[0].attempt) not in acked]
        for keys, until in list(backing_off.items()):
            if until <= now or ignore_backoff:
                backing_off.pop(keys, None)
        outcomes, deferred = pending, []
        if backing_off:
            outcomes = [o for o in pending if o.job.keys not in backing_off]
            deferred = [o for o in pending if o.job.keys in backing_off]
        alone = [o for o in outcomes if payload_size(o) > LARGE_ACK or id(o) in self._alone]
        if alone:
            outcomes = [o for o in outcomes
                        if payload_size(o) <= LARGE_ACK and id(o) not in self._alone]
        if outcomes or started:
            try:
                self._send(outcomes, deferred, started, now)
            except BaseException:
                self._keep(alone)
                raise
        else:
            self._keep(deferred)
        for index, o in enumerate(alone):
            try:
                self._send([o], [], [], now)
            except BaseException as exc:  # (_send kept o to send again)
                if not isinstance(exc, Exception) or not self._refused_alone(o, exc):
                    self._keep(alone[index + 1:])
                    raise
            else:
                self._refused.pop(id(o), None)
                self._alone.discard(id(o))

    def _refused_alone(self, o: Outcome, exc: Exception) -> bool:
        """After the round trip of ``o`` alone failed (``o`` kept to send again): whether
        Redis answers, so it refused that ack. Once it did LARGE_ACK_TRIES times, ``o`` is
        replaced by the failure of its job without its payload; if ``o`` was that failure
        already, it is dropped: the job's lease lapses and the job is reclaimed."""
        # Redis out of reach, or taking no write for now (OOM, LOADING...), refuses no ack
        # in particular; a large ack's refusal, though, is a dropped connection.
        if not self.broker.answers() or (is_transient(exc) and payload_size(o) <= LARGE_ACK):
            return False
        tries = self._refused.pop(id(o), 0) + 1
        if tries < LARGE_ACK_TRIES:
            self._refused[id(o)] = tries
            return True
        self._alone.discard(id(o))
        if isinstance(o.exception, AckRefused):
            log(logger, logging.ERROR, "Redis refused the failure of a job whose ack it "
                "refused, dropping it: the job runs again once its lease lapses",
                job=o.job.id, queue=o.job.queue, task=o.job.task, worker=self.name, error=exc)
            with self._lock:
                self.outcomes = [x for x in self.outcomes if x is not o]
            self.ledger.settle([o.job])
            return True
        log(logger, logging.ERROR, "Redis refused the ack of a job, failing the job without "
            "its result", job=o.job.id, queue=o.job.queue, task=o.job.task,
            bytes=payload_size(o), worker=self.name, error=exc)
        refused = failure(o.job, AckRefused(
            f"Redis refused the ack of this job ({payload_size(o)} bytes of result, error "
            f"and traceback; a limit of the server such as proto-max-bulk-len, or a value "
            f"it cannot take): {exc}"), retry=False)
        refused.started_ms, refused.finished_ms = o.started_ms, o.finished_ms
        with self._lock:
            self.outcomes = [refused if x is o else x for x in self.outcomes]
        return True

    def _send(self, outcomes: list[Outcome], deferred: list[Outcome],
              started: list[tuple[ClaimedJob, int]], now: float) -> None:
        """Send ``outcomes`` and ``started`` in one round trip and settle what landed;
        ``deferred`` (their shards backing off) are kept for later."""
        backing_off = self._backoff_until
        try:
            sent = send_outcomes(self.broker, outcomes, worker=self.name, started=started)
        except BaseException as exc:  # nothing known to have landed: an ack that did is stale
            self._keep(outcomes + deferred)
            with self._lock:
                self.started[:0] = started
            if not is_transient(exc):  # refused for what it carries: each goes alone next
                self._alone.update(id(o) for o in outcomes)
            raise
        if sent.short_replicas is not None:
            log(logger, logging.WARNING, "acks confirmed by too few replicas "
                "(MIN_REPLICAS_ACKS): a failover now may run those jobs again",
                replicas=sent.short_replicas, min_replicas=self.broker.config.min_replicas,
                worker=self.name)
        if sent.stale:
            log(logger, logging.WARNING, "acks were stale: the lease had lapsed and another "
                "attempt owns the job", acks=sent.stale, worker=self.name)
        for keys in sent.outboxes:
            # Release dependants in other shards now; if this fails (or the process
            # dies), the entries stay for any worker's heartbeat to deliver.
            try:
                flows.deliver(self.broker, keys)
            except Exception as exc:
                log(logger, logging.WARNING, "releases of dependants left for the heartbeat",
                    queue=keys.queue, worker=self.name, error=exc)
        alone = {id(o) for o in sent.refused}
        # shards that could not take their acks now back off; refused acks go alone
        refused = {o.job.keys for o in sent.unsent if id(o) not in alone}
        unsent = {id(o) for o in sent.unsent}
        self._keep(sent.unsent + deferred)  # only the refused calls go again
        landed = [o for o in outcomes if id(o) not in unsent]
        self.ledger.settle(o.job for o in landed)
        with self._lock:
            for o in landed:
                fate = sent.fates.get(id(o), "stale")
                if fate == "completed":
                    self.completed += 1
                elif fate == "retried":
                    self.retried += 1
                elif fate == "failed":
                    self.failed += 1
                elif fate == "cancelled":
                    self.cancelled += 1
                else:
                    self.stale += 1
        # One line per finished job at INFO; failures (WARNING, ERROR) even when quiet.
        if logger.isEnabledFor(logging.WARNING):
            verbose = logger.isEnabledFor(logging.INFO)
            for o in landed:
                if verbose or not o.ok:
                    log_finished(o, sent.fates.get(id(o), "stale"), self.name)
        if sent.error is None:
            return
        if sent.refused:  # refused for what they carry: each goes alone next
            self._alone.update(alone)
            log(logger, logging.WARNING, "acks refused, to be sent one by one",
                acks=len(sent.refused), worker=self.name, error=sent.error)
        if len(sent.unsent) == len(outcomes):
            raise sent.error
        if not refused:
            return
        for keys in refused:
            backing_off[keys] = now + SHARD_BACKOFF
        log(logger, logging.WARNING, "acks refused by shards, deferred", retry_in_s=SHARD_BACKOFF,
            worker=self.name, shards=",".join(k.tag for k in refused), error=sent.error)

    def _keep(self, outcomes: list[Outcome]) -> None:
        """Put ``outcomes`` back at the head of the pending ones, to send again."""
        if outcomes:
            with self._lock:
                self.outcomes[:0] = outcomes

    def flush_until_done(self, deadline: float) -> None:
        """At shutdown: send every pending outcome, deferred ones too, until ``deadline``."""
        while True:
            try:
                self.flush(ignore_backoff=True)
            except Exception as exc:
                log(logger, logging.WARNING, "acks not sent at shutdown", worker=self.name,
                    error=exc)
            if not self.outcomes:
                return
            if time.monotonic() >= deadline:
                log(logger, logging.WARNING, "acks not sent at shutdown: their jobs run again "
                    "once their leases lapse", acks=len(self.outcomes), worker=self.name)

                return
            time.sleep(0.2)
