"""What the failover soaks (``tests/test_failover.py``) check besides the jobs: the
metrics a scraper reads all through the failover, and jobs held past the switch.

A :class:`Scraper` reads the metrics view's figures (its collector, on a client of its
own, as a web process would) every 0.25 s from before the failover until the end,
keeping each scrape that Redis answered: every counter series must never go down across
them. Held jobs are enqueued with a delay far past the switch among the producers' jobs,
and brought due only once the failover is over (the old primary a replica, its writes dropped): each
acknowledged one must then still be in Redis and run, and none may start before.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from prometheus_client.core import Metric

from django_delayq import DelayQConnectionError, Job, JobNotFound
from django_delayq.engine import Broker
from django_delayq.engine.backlog import backlogs
from django_delayq.metrics import DelayQCollector
from django_delayq.mirror.consumer import GROUP

#: Seconds a held job is delayed: far past any switch; the test brings it due itself.
HELD_DELAY = 3600
#: Interval between two scrapes.
SCRAPE_EVERY = 0.25

Series = tuple[str, tuple[tuple[str, str], ...]]


def is_held(i: int) -> bool:
    """Whether the ``i``-th job of a producer is held past the switch (one in 20)."""
    return i % 20 == 5


def counters_of(metrics: list[Metric]) -> dict[Series, float]:
    """Every sample of every counter and histogram series (totals, buckets, sums)."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in metrics if family.type in ("counter", "histogram")
            for sample in family.samples if not sample.name.endswith("_created")}


class Scraper:
    """Scrapes the figures every :data:`SCRAPE_EVERY` seconds in a thread; keeps
    ``(time, counters)`` of each scrape Redis answered, and how many it did not."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.collector = DelayQCollector(broker)
        self.scrapes: list[tuple[float, dict[Series, float]]] = []
        self.refused = 0
        #: Errors other than an unreachable Redis: each one is a bug of the read.
        self.errors: list[BaseException] = []
        self._scraped = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.broker.close()

    def scrape(self) -> dict[Series, float]:
        return counters_of(list(self.collector.collect()))

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_EVERY):
            try:
                self.scrapes.append((time.time(), self.scrape()))
                self._scraped.set()
            except DelayQConnectionError:
                self.refused += 1
            except Exception as exc:  # reported by the test, not lost with the thread
                self.errors.append(exc)

    def await_scrape(self, timeout: float = 60) -> None:
        """Return once a scrape started after this call was answered: the figures
        before a failover, for the scrapes after it to be compared with."""
        self._scraped.clear()
        assert self._scraped.wait(timeout), "no scrape answered"
        self._scraped.clear()
        assert self._scraped.wait(timeout), "no scrape answered"

    def answered_after(self, moment: float) -> int:
        """How many scrapes Redis answered after ``moment``."""
        return sum(1 for at, _ in self.scrapes if at > moment)

    def decreases(self) -> list[str]:
        """Every time a series read lower than the scrape before it had it."""
        found, last = [], {}
        for at, counters in self.scrapes:
            for series, figure in counters.items():
                if figure < last.get(series, (0.0, figure))[1]:
                    found.append(f"{series} {last[series][1]:g} at {last[series][0]:.3f} "
                                 f"-> {figure:g} at {at:.3f}")
                last[series] = (at, figure)
        return found


def mirror_lag(broker: Broker, queues: list[str]) -> dict[str, int]:
    """The ``delayq_mirror_lag_events`` gauge of each of ``queues``."""
    return {name: backlog.events for name, backlog in backlogs(broker, queues, GROUP).items()}


def bring_due(broker: Broker, queue: str, ids: list[str]) -> tuple[float, list[str]]:
    """Move every held job of ``ids`` to now; the moment it was done (no held job may
    have started before it) and the ids Redis no longer had."""
    moment, missing = time.time(), []
    for job_id in ids:
        try:
            Job.fetch(job_id, queue, broker=broker).reschedule(delay=0)
        except JobNotFound:
            missing.append(job_id)
    return moment, missing


def held_started_before(client: Any, broker: Broker, queue: str, ids: list[str],
                        moment: float) -> list[str]:
    """Held jobs of ``ids`` that started before they were brought due at ``moment``."""
    from django_delayq.engine.fields import stored

    pipe = client.pipeline(transaction=False)
    for job_id in ids:
        pipe.hget(broker.keys_for(queue, job_id).job(job_id), stored("started_at"))
    return [job_id for job_id, started in zip(ids, pipe.execute(), strict=True)
            if started is not None and int(started) < int(moment * 1000) - 1]
