"""The relay: moves outbox rows to Redis when the commit hook could not.

Each round locks a chunk of waiting rows in a transaction, sends them with the engine's
bulk enqueue (job ids dedupe, so a row sent twice is one job), and deletes them in the
same transaction, once Redis has them. A crash between the send and the commit leaves
the rows to be sent again: still one job each.

Two relays never send the same row: on PostgreSQL (and MySQL, Oracle) a round takes its
rows with ``SELECT ... FOR UPDATE SKIP LOCKED``, so each relay gets other rows; SQLite
has no row locks, so a round starts with a write that takes the database's write lock
and relays take turns, a round at a time.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Collection

from django.db import (
    DEFAULT_DB_ALIAS,
    DatabaseError,
    connections,
    transaction,
)

from ..conf import conf
from ..connection import get_broker
from ..engine import Broker
from ..engine.backoff import Backoff
from ..engine.logfields import log
from ..models import OutboxEntry
from .send import Outcome, relax_commit, send_rows, settle, take

logger = logging.getLogger(__name__)
#: Rounds in a row that may fail before ``run(burst=True)`` gives up.
BURST_TRIES = 3


@dataclasses.dataclass
class RoundResult:
    """What one round of the relay did."""

    rows: int = 0  # rows taken
    outcome: Outcome = dataclasses.field(default_factory=Outcome)
    parked: int = 0


class Relay:
    """Sends the outbox rows of database ``using`` to Redis until stopped.

    Pass the task registry as ``known_tasks`` to park rows whose task is unknown here.

    ``run()`` loops (an empty outbox is read every ``poll_interval`` seconds);
    ``run(burst=True)`` sends what is waiting and returns. An unreachable Redis or
    database is retried with a capped backoff (0.1 s doubling to 5 s) for as long as it
    lasts: rows are parked only when Redis or the checks refuse them, never for an
    outage, however long, or however many relays (one per ``runworker`` or pool, and
    ``delayq_mirror``) try meanwhile.
    """

    def __init__(self, *, using: str = DEFAULT_DB_ALIAS, broker: Broker | None = None,
                 chunk_size: int | None = None, poll_interval: float | None = None,
                 known_tasks: Collection[str] | None = None) -> None:
        options = conf.OUTBOX
        self.using = using
        self.broker = broker or get_broker()
        self.chunk_size = chunk_size or int(options["CHUNK_SIZE"])
        self.poll_interval = float(options["POLL_INTERVAL"] if poll_interval is None
                                   else poll_interval)
        #: The task registry: rows naming another task are parked (None: not checked).
        self.known_tasks = known_tasks
        self.sent = 0  # rows Redis took (new jobs and duplicates)
        self.added = 0  # new jobs
        self.duplicates = 0  # rows whose job Redis already had
        self.parked = 0
        self.rounds = 0  # rounds that sent something
        self.last_error: BaseException | None = None
        self._stop = threading.Event()

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, *, burst: bool = False) -> int:
        """Relay until stopped (``burst``: until nothing is waiting, or until
        :data:`BURST_TRIES` rounds in a row failed).

        Returns the number of rows sent.
        """
        log(logger, logging.INFO, "outbox relay started", database=self.using, burst=burst)
        backoff = Backoff(self._stop, first=0.1, cap=5.0)
        failures = 0
        while not self._stop.is_set():
            try:
                done = self.step()
                failure = done.outcome.failure
            except DatabaseError as exc:
                # On SQLite, also another relay holding the write lock past the busy timeout.
                done, failure = RoundResult(), exc
                if not connections[self.using].in_atomic_block:
                    connections[self.using].close()  # reconnect next round
            except Exception as exc:  # a bug or a surprise must not end the relay thread
                log(logger, logging.ERROR, "outbox relay round failed", exc_info=True,
                    database=self.using)
                done, failure = RoundResult(), exc
            if failure is not None:
                self.last_error = failure
                failures += 1
                what = ("use the database" if isinstance(failure, DatabaseError)
                        else "send to Redis")
                log(logger, logging.WARNING, f"outbox relay cannot {what}",
                    retry_in_s=backoff.delay, database=self.using, rows=done.rows,
                    error=failure)
                if burst and failures >= BURST_TRIES:
                    break
                backoff.wait()
                continue
            self.last_error, failures = None, 0
            backoff.reset()
            if done.rows < self.chunk_size:
                if burst:
                    break
                self._stop.wait(self.poll_interval)
        log(logger, logging.INFO, "outbox relay stopped", database=self.using, sent=self.sent,
            parked=self.parked)
        return self.sent

    def step(self) -> RoundResult:
        """One round: lock a chunk of waiting rows, send them, settle them, commit."""
        done = RoundResult()
        waiting = OutboxEntry.objects.using(self.using).filter(parked_at__isnull=True)
        if not waiting.exists():  # the usual case: no transaction, no lock, one query
            return done
        with transaction.atomic(using=self.using):
            relax_commit(self.using)  # a round lost in a crash is sent again: one job each
            taken = take(self.using, waiting, self.chunk_size)
            if not taken:
                return done
            done.rows = len(taken)
            done.outcome = send_rows(self.broker, taken, self.known_tasks)
            done.parked = settle(self.using, done.outcome, [row.pk for row in taken])
        outcome = done.outcome
        self.sent += len(outcome.sent)
        self.added += outcome.added
        self.duplicates += outcome.duplicates
        self.parked += done.parked
        if outcome.sent:
            self.rounds += 1
            log(logger, logging.INFO, "outbox relay sent", rows=len(outcome.sent),
                new=outcome.added, duplicates=outcome.duplicates, parked=done.parked,
                database=self.using)

        return done


def relay_table_exists(using: str) -> bool:
    """Whether the outbox table exists in database ``using`` (unknown: taken for yes)."""
    try:
        return OutboxEntry._meta.db_table in connections[using].introspection.table_names()
    except DatabaseError:
        return True  # the database is down: the relay's own backoff handles it
