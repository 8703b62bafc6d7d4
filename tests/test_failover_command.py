"""Redis's own ``FAILOVER`` (6.2+) under load: a primary hands over to a replica, with
no Sentinel (the sentinels would fail over again) and no Cluster. Clients reach the
primary through one address that the operator (or a managed service) moves to the new
primary once it serves, as a DNS name or a virtual address would be moved.

The same load and the same checks as ``tests/test_failover.py``: two sets of producers
(``MIN_REPLICAS`` 1 and 0), two ``runworker`` processes with their mirrors, jobs held
past the switch, the metrics scraped all through. ``FAILOVER`` pauses the primary's
writes until a replica has them all, then demotes it: it answers ``READONLY`` from then
on, each process drops its connections on that and reconnects through the address.
"""

from __future__ import annotations

import time

import pytest
import redis

from django_delayq.engine import Broker
from django_delayq.engine.urls import client_from_url
from django_delayq.testing import RedisServer
from tests.conftest import wait_until
from tests.endpoint import Endpoint
from tests.failover_checks import Scraper
from tests.failover_load import (
    FAILOVER_RETRY,
    QUEUE_0,
    REPLICA_TIMEOUT,
    AfterSwitch,
    Producers,
    Timeline,
    check_after_settle,
    check_promises,
    engine_config,
    migrated_db,
    mirror_db,
    release_held,
    report,
    settle,
    workers,
)
from tests.servers import REPLICATION_ARGS

pytestmark = pytest.mark.slow
__all__ = ["migrated_db", "mirror_db", "workers"]  # fixtures, found by pytest here


def role(server: RedisServer) -> str:
    with redis.Redis(port=server.port, decode_responses=True, socket_timeout=5) as client:
        return str(client.info("replication").get("role"))


def test_failover_command_under_load(mirror_db, workers, fault_report):
    """``FAILOVER TO`` a replica of a primary with two, under load; the address moves
    once the replica serves as the primary."""
    timeline = Timeline("failover-command")
    with RedisServer(extra_args=REPLICATION_ARGS) as old:
        follow = ("--replicaof", "127.0.0.1", str(old.port), *REPLICATION_ARGS)
        with RedisServer(extra_args=follow) as new, RedisServer(extra_args=follow), \
                Endpoint(old.port) as endpoint:
            with redis.Redis(port=old.port, decode_responses=True) as direct:
                wait_until(lambda: direct.info("replication")["connected_slaves"] == 2,
                           message="two replicas")
            url = endpoint.url
            settings = {"MIN_REPLICAS": 1, "MIN_REPLICAS_TIMEOUT": REPLICA_TIMEOUT,
                        "FAILOVER_RETRY": FAILOVER_RETRY}
            procs = [workers(url, mirror_db, settings) for _ in range(2)]
            for _, out in procs:
                out.wait_for("mirror started", timeout=60)
            client = client_from_url(url, decode_responses=True, socket_timeout=5)
            durable = Producers(Broker(client, engine_config(1)), "f1")
            fast = Producers(Broker(client, engine_config(0)), "f0", queue=QUEUE_0)
            sets, found = {1: durable, 0: fast}, AfterSwitch()
            scraper = Scraper(Broker(client_from_url(url, decode_responses=True,
                                                     socket_timeout=5), engine_config(0)))
            scraper.__enter__()
            for producers in sets.values():
                producers.start()
            durable.progress.wait(timeout=120)
            fast.progress.wait(timeout=120)
            scraper.await_scrape()  # the figures before the failover
            timeline.killed_at = time.time()
            with redis.Redis(port=old.port, socket_timeout=5) as direct:
                direct.execute_command("FAILOVER", "TO", "127.0.0.1", new.port,
                                       "TIMEOUT", 10_000)
            timeline.note(f"FAILOVER TO {new.port} sent to {old.port}", timeline.killed_at)
            wait_until(lambda: role(old) == "slave" and role(new) == "master", timeout=30,
                       interval=0.05, message="the handover")
            timeline.note(f"{old.port} a replica, {new.port} the primary")
            endpoint.point_to(new.port)
            timeline.note(f"the address moved to {new.port}")
            for producers in sets.values():
                producers.join()
            release_held(client, sets, found)
            outs = [o for _, o in procs]
            measured = {n: settle(client, p, mirror_db, outs) for n, p in sets.items()}
            check_after_settle(client, sets, scraper, found, timeline)
            scraper.__exit__()
            for proc, out in procs:
                assert proc.poll() is None, f"the worker must resume by itself:\n{out.text}"
            report(fault_report, "FAILOVER (Redis's own) under load", timeline,
                   [(1, durable, measured[1]), (0, fast, measured[0])])
            for proc, _ in procs:
                proc.terminate()
            for proc, out in procs:
                assert proc.wait(timeout=60) == 0, out.text[-3000:]
            client.close()
    check_promises(measured, found)
