"""The heartbeat: renews the leases the worker holds, reclaims expired leases of dead
workers, and records this worker as alive, in one round trip every ``lease / 3`` s.

It renews only what :meth:`Ledger.renewable` lists: a job no live thread runs (its
thread died, or it overran its time limit plus the grace) is left to lapse, so another
worker reclaims it. The same reply names the held jobs whose abort was asked for
(``Job.abort()``): the ledger notes them (:meth:`Ledger.request_abort`) and the watchdog
stops them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ...engine import Broker, QueueKeys, flows
from ...engine.logfields import log
from ...engine.workers import record_alive
from ..backoff import CALL_FAILED
from .acks import by_shard
from .ledger import Ledger

logger = logging.getLogger("django_delayq.worker")

#: Seconds between two beats at most, whatever the lease: a worker hears of an abort
#: asked for one of its jobs within this.
MAX_INTERVAL = 10.0


class Heartbeat:
    """Lease renewal, reclaim and liveness of one worker."""

    def __init__(self, *, broker: Broker, name: str, lease_ms: int,
                 shards: Sequence[QueueKeys], ledger: Ledger, done: threading.Event,
                 info: Callable[[], dict[str, Any]]) -> None:
        self.broker = broker
        self.name = name
        self.lease_ms = lease_ms
        self.shards = list(shards)
        self.ledger = ledger
        self._done = done
        self._info = info
        self.interval = max(0.2, min(lease_ms / 3000, MAX_INTERVAL))

    def run(self) -> None:
        """Beat every :attr:`interval` until the worker is done. Nothing ends the loop
        early: without it no lease is renewed, nothing reclaimed, and the worker drops
        out of the registry while it goes on claiming."""
        while not self._done.wait(self.interval):
            try:
                self.beat()
            except CALL_FAILED as exc:
                log(logger, logging.WARNING, "heartbeat failed", worker=self.name, error=exc)
            except Exception:
                log(logger, logging.ERROR, "heartbeat failed, next beat retries",
                    exc_info=True, worker=self.name)

    def beat(self, *, renew: bool = True) -> None:
        """One heartbeat: renew (unless ``renew`` is False), reclaim, record alive."""
        held = self.ledger.renewable() if renew else []
        batch = self.broker.batch()
        renewed = by_shard(held)
        extend_calls = [(keys, self.broker.add_extend(batch, keys, pairs, self.lease_ms))
                        for keys, pairs in renewed.items()]
        reclaim_calls = [(keys, self.broker.add_reclaim(batch, keys, link_grace_ms=self.lease_ms))
                         for keys in self.shards]
        # A shard that refuses (a Redis Cluster slot on the move, a damaged key) costs
        # only its own calls: the others' replies are read, and the worker stays listed.
        replies = batch.run(raise_on_error=False)
        for keys, index in (*extend_calls, *reclaim_calls):
            if isinstance(replies[index], Exception):
                log(logger, logging.WARNING, "heartbeat refused by a shard, next beat "
                    "retries", shard=keys.tag, worker=self.name, error=replies[index])
        for keys, index in extend_calls:
            if isinstance(replies[index], Exception):
                continue
            lost_ids, asked = replies[index]
            attempts = dict(renewed[keys])  # the engine names a lease by its job's id
            lost = self.ledger.lost(keys, [(job_id, attempts[job_id]) for job_id in lost_ids])
            if lost:
                log(logger, logging.WARNING, "lease lost", queue=keys.queue, jobs=len(lost),
                    ids=",".join(lost[:10]), worker=self.name)
            aborting = self.ledger.request_abort(keys, [
                (job_id, attempts[job_id], who)
                for job_id, who in zip(asked[::2], asked[1::2], strict=True)])
            if aborting:
                log(logger, logging.WARNING, "abort asked for", queue=keys.queue,
                    jobs=len(aborting), ids=",".join(aborting[:10]), worker=self.name)

        undelivered, unlinked = [], []
        for keys, index in reclaim_calls:
            if isinstance(replies[index], Exception):
                continue
            returned, dead, outbox, to_link, _ = replies[index]
            if returned or dead:
                log(logger, logging.WARNING, "reclaimed expired leases", queue=keys.queue,
                    returned=returned, dead_lettered=dead, worker=self.name)
            if outbox:
                undelivered.append(keys)
            if to_link:
                unlinked.append((keys, to_link))
        # Dependants whose producer stopped between storing and linking them. A shard
        # whose repair fails leaves the others, and the rest of the beat, unharmed.
        for keys, job_ids in unlinked:
            try:
                flows.repair(self.broker, keys, job_ids)
            except CALL_FAILED as exc:
                log(logger, logging.WARNING, "waiting jobs not linked again, a heartbeat "
                    "retries after the grace period", queue=keys.queue,
                    jobs=len(job_ids), ids=",".join(job_ids[:10]), error=exc)
            except Exception:
                log(logger, logging.ERROR, "waiting jobs not linked again, a heartbeat "
                    "retries after the grace period", exc_info=True, queue=keys.queue,
                    jobs=len(job_ids), ids=",".join(job_ids[:10]))
        # Releases of dependants in other shards that no acker delivered (its worker
        # died between two steps): delivering again is harmless (engine/flows.py).
        for keys in undelivered:
            try:
                flows.deliver(self.broker, keys)
            except CALL_FAILED as exc:
                log(logger, logging.WARNING, "releases of dependants not delivered, next "
                    "beat retries", queue=keys.queue, error=exc)
            except Exception:
                log(logger, logging.ERROR, "releases of dependants not delivered, next beat "
                    "retries", exc_info=True, queue=keys.queue)
        self.record_alive()

    def record_alive(self) -> None:
        record_alive(self.broker, self.name, max(60, int(self.lease_ms / 1000 * 3)),
                     self._info())
