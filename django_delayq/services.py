"""Every background loop a host runs, from one list (:func:`host_services`).

``runworker`` (with or without ``--processes``) and ``delayq_mirror`` run their loops
in a :class:`~django_delayq.runtime.host.Host`, on threads of its process, which runs no
job: the model mirror (unless ``--no-mirror``, or without its table), the outbox relay
(one per database of ``DELAYQ["OUTBOX"]["DATABASES"]``, unless its ``RELAY`` is off),
the lake export (when ``DELAYQ["LAKE_PATH"]`` is set) and the periodic scheduler (for
the periodic tasks of the queues the host's workers serve).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import connections

from .conf import conf
from .connection import get_broker
from .engine.logfields import log
from .engine.workers import lake_consumer, mirror_consumer
from .mirror import Mirror, table_exists
from .outbox.relay import Relay, relay_table_exists
from .runtime.consumer import StreamConsumer
from .runtime.host import Service
from .runtime.periodic import Scheduler
from .runtime.registry import registry

logger = logging.getLogger("django_delayq.worker")

class SinkService:
    """A stream consumer (the model mirror, the lake export) run by a host; a warm stop
    lets it write what the workers that stopped before it wrote last (its drain)."""

    def __init__(self, name: str, consumer: StreamConsumer) -> None:
        self.name = name
        self.consumer = consumer

    def run(self) -> None:
        try:
            self.consumer.run()
        finally:
            connections.close_all()  # this thread's own connections

    def stop(self, *, drain: bool) -> None:
        self.consumer.stop(drain=drain)


class RelayService:
    """The outbox relay of one database."""

    def __init__(self, using: str) -> None:
        self.name = f"relay-{using}"
        self.relay = Relay(using=using, known_tasks=registry)

    def run(self) -> None:
        try:
            self.relay.run()
        finally:
            connections.close_all()

    def stop(self, *, drain: bool) -> None:
        self.relay.request_stop()


def host_services(host: str, *, mirror: bool = True, relay: bool = True,
                  lake: bool = True, scheduler_queues: Sequence[str] = (),
                  mirror_queues: Sequence[str] | None = None) -> list[Service]:
    """The loops of a host named ``host``, each on its setting: the mirror (``mirror``,
    and only with its table), the relays (``relay``), the lake export (``lake``), the
    periodic scheduler of the periodic tasks of ``scheduler_queues``."""
    services: list[Service] = []
    if mirror:
        if table_exists():
            services.append(SinkService("mirror", Mirror(name=mirror_consumer(host),
                                                         queues=mirror_queues)))
        else:
            log(logger, logging.WARNING, "the mirror is off: the Job table is missing (run "
                "manage.py migrate)")
    if relay and conf.OUTBOX["RELAY"]:
        for alias in conf.OUTBOX["DATABASES"]:
            if relay_table_exists(alias):
                services.append(RelayService(alias))
            else:
                log(logger, logging.WARNING, "the outbox relay is off: its table is missing "
                    "(run manage.py migrate)", database=alias)
    if lake and conf.LAKE_PATH is not None:
        try:
            from .lake.export import Exporter  # PyArrow: an optional extra, only when set
        except ImportError as exc:
            log(logger, logging.ERROR, "the lake export is off (pip install "
                "'django-delayq[spark]')", error=exc)

        else:
            services.append(SinkService("lake", Exporter(
                conf.LAKE_PATH, name=lake_consumer(host),
                broker=get_broker(socket_timeout=1.0 + conf.SOCKET_TIMEOUT))))
    periodic = registry.periodic(scheduler_queues)
    if periodic:
        services.append(Scheduler(get_broker(), periodic, lookahead=conf.CRON_LOOKAHEAD,
                                  missed=conf.CRON_MISSED,
                                  catch_up_max=conf.CRON_CATCH_UP_MAX))
    connections.close_all()  # the table checks' connections: the threads open their own
    return services
