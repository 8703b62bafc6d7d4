"""Prometheus metrics of django-delayq, read from Redis at scrape time (``metrics`` extra).

Mount the view: ``path("metrics/delayq/", include("django_delayq.metrics.urls"))``, or
use :func:`metrics_view` in your own URL. Every figure comes from counters the Lua
scripts keep (:mod:`django_delayq.engine.stats`, read so that no total ever goes back:
``lua/counters.lua``), the status sets' sizes and the events streams, so a scrape costs
a few commands per queue shard, whatever the number of jobs, sent in a fixed number of
round trips (pipelined) whatever the number of queues, and any web process answers the
same figures. With ``PROMETHEUS_MULTIPROC_DIR`` set (prometheus_client's multiprocess
mode), the view also serves the metrics your own code records in every process of the
host (worker pool processes included).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from ..engine.errors import ExtraMissing

try:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
        Metric,
    )
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ExtraMissing("django_delayq.metrics", "prometheus_client", "metrics") from exc

from django.http import HttpRequest, HttpResponse

from ..connection import get_broker
from ..engine import Broker, DelayQConnectionError, Queue
from ..engine.backlog import backlogs
from ..engine.errors import CommandRefused
from ..engine.keyed import key_loads
from ..engine.logfields import log
from ..engine.overview import summaries
from ..engine.stats import Histogram
from ..engine.workers import count_alive, served_queues
from ..mirror.consumer import GROUP
from ..task import registry

#: Concurrency keys per queue with a series of their own (bounded cardinality).
TOP_KEYS = 10

def queue_names(broker: Broker) -> list[str]:
    """Queues seen in Redis or used by a registered task."""
    return sorted({q.name for q in Queue.all(broker=broker)} | set(registry.queues()))


def _histogram(name: str, doc: str, per_queue: dict[str, Histogram]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=["queue"], unit="seconds")
    for queue, histogram in per_queue.items():
        family.add_metric([queue], histogram.cumulative(), histogram.sum_ms / 1000)
    return family


class DelayQCollector(Collector):
    """Reads the figures from Redis at each scrape."""

    def __init__(self, broker: Broker | None = None) -> None:
        self._broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self._broker or get_broker()
        names = queue_names(broker)
        read = summaries(broker, names, confirm_primary=True)
        served = served_queues(broker)
        jobs = GaugeMetricFamily("delayq_jobs", "Jobs per queue and status now (finished "
                                 "ones: those still kept).", labels=["queue", "status"])
        paused = GaugeMetricFamily("delayq_queue_paused", "1 while the queue is paused.",
                                   labels=["queue"])
        unserved = GaugeMetricFamily("delayq_queue_unserved", "1 while no live worker serves "
                                     "the queue: its jobs wait until one does.",
                                     labels=["queue"])
        lag = GaugeMetricFamily("delayq_mirror_lag_events", "Events of the queue the model "
                                "mirror has not applied yet (pending, and after the last "
                                "one delivered to it).", labels=["queue"])
        capped = GaugeMetricFamily("delayq_mirror_lag_capped", "1 when the lag of the queue "
                                   "is a lower bound (counted up to a cap per shard).",
                                   labels=["queue"])
        slots = GaugeMetricFamily("delayq_key_waiting_jobs", "Ready jobs waiting for a "
                                  "slot of their concurrency key: in all (key=\"\") and "
                                  f"for the {TOP_KEYS} keys with the most.",
                                  labels=["queue", "key"])
        running = GaugeMetricFamily("delayq_key_active_jobs", "Jobs running, for the "
                                    f"{TOP_KEYS} concurrency keys with the most.",
                                    labels=["queue", "key"])
        loads = key_loads(broker, names, TOP_KEYS)
        for summary, load in zip(read, loads, strict=True):
            name = summary.name
            for status, n in summary.counts.items():
                jobs.add_metric([name, status], n)
            paused.add_metric([name], int(summary.paused))
            unserved.add_metric([name], int(name not in served))
            slots.add_metric([name, ""], load.waiting_total)
            for key, n in load.waiting:
                slots.add_metric([name, key], n)
            for key, n in load.active:
                running.add_metric([name, key], n)
        for name, backlog in backlogs(broker, names, GROUP).items():
            lag.add_metric([name], backlog.events)
            capped.add_metric([name], int(backlog.capped))
        yield jobs
        yield paused
        yield unserved
        yield slots
        yield running
        yield lag
        yield capped
        totals = [("enqueued", "Jobs enqueued."), ("started", "Attempts started."),
                  ("completed", "Jobs completed."),
                  ("failed", "Jobs failed for good (dead-lettered)."),
                  ("retried", "Failed attempts that were retried.")]
        for attr, doc in totals:
            family = CounterMetricFamily(f"delayq_jobs_{attr}", doc, labels=["queue"])
            for summary in read:
                since = summary.counters_since
                family.add_metric([summary.name], getattr(summary.stats, attr),
                                  created=since.timestamp() if since else None)
            yield family
        yield _histogram("delayq_job_duration", "Run time of completed jobs (as the worker "
                         "measured it, without the wait for the ack).",
                         {q.name: q.stats.duration for q in read})
        yield _histogram("delayq_job_start_lateness", "Time from run_at to the start of "
                         "each attempt.", {q.name: q.stats.lateness for q in read})
        yield GaugeMetricFamily("delayq_workers_alive", "Workers with a heartbeat in the "
                                "last 30 seconds.", value=count_alive(broker))


def registry_for_scrape() -> CollectorRegistry:
    """A registry with django-delayq's figures (and, in multiprocess mode, the metrics
    every process of the host wrote to ``PROMETHEUS_MULTIPROC_DIR``)."""
    registry_ = CollectorRegistry(auto_describe=False)
    registry_.register(DelayQCollector())
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.MultiProcessCollector(registry_)
    return registry_


def metrics_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """The Prometheus text format; 503 when Redis is unreachable (no figure is better
    than a zero that looks like an empty queue)."""
    try:
        body = generate_latest(registry_for_scrape())
    except DelayQConnectionError:
        return HttpResponse("django-delayq metrics: Redis is unreachable\n", status=503,
                            content_type="text/plain; charset=utf-8")
    except CommandRefused as exc:  # a damaged key, an ACL: logged, and no figure
        log(logging.getLogger("django_delayq.metrics"), logging.WARNING,
            "metrics: Redis refused a read", error=exc)
        return HttpResponse("django-delayq metrics: Redis refused a read (see the log)\n",
                            status=503, content_type="text/plain; charset=utf-8")
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)
