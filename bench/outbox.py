"""The transactional outbox on PostgreSQL: what a durable enqueue costs, and the relay.

    python -m bench.outbox [--scale 1] [--transactions 2000] [--rows 5000] [--samples 20]

Starts a throwaway Redis and a throwaway PostgreSQL (``tests/pg_server.py``), or uses a
fresh database on the server of ``DELAYQ_BENCH_PG`` (``host:port:user``), dropped at
the end. It times transactions of one application INSERT and one enqueue (a typical
request), next to the INSERT alone:

- ``enqueue_on_commit``: the job sent to Redis from an ``on_commit`` hook;
- ``enqueue_in_transaction``: the row written in the transaction, sent and deleted by
  the commit hook (the fast path);
- ``enqueue_in_transaction`` without the fast path: the row alone (the relay sends it);

then the relay: ``--rows`` rows written while Redis is down, and the time from Redis
being back to the first and the last of their jobs in Redis (a relay thread backing
off meanwhile); and the latency from commit to job in Redis when the commit hook is off
and only the relay (polling every ``POLL_INTERVAL``) sends rows. Prints each figure and
writes ``outbox.json`` (in ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import django
from django.conf import settings

from bench import record
from django_delayq.testing import RedisServer

POLL_INTERVAL = 1.0
TRANSACTIONS = 2_000
ROWS = 5_000
SAMPLES = 20


@contextlib.contextmanager
def postgres() -> Iterator[str]:
    """``host:port:user`` of DELAYQ_BENCH_PG, or of a throwaway server of our own."""
    from tests.pg_server import PostgresServer

    given = os.environ.get("DELAYQ_BENCH_PG")
    own = None if given else PostgresServer().start()
    try:
        yield given or f"{own.host}:{own.port}:{own.user}"
    finally:
        if own is not None:
            own.cleanup()


def configure(pg: str, redis_url: str, db_name: str) -> None:
    host, port, user = pg.split(":")
    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_delayq"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "HOST": host,
                               "PORT": port, "USER": user, "NAME": db_name}},
        USE_TZ=True,
        DELAYQ={"REDIS_URL": redis_url, "SOCKET_CONNECT_TIMEOUT": 0.5,
                "OUTBOX": {"RELAY": False, "POLL_INTERVAL": POLL_INTERVAL}},
        LOGGING_CONFIG=None,
    )
    django.setup()


def admin_connection(host_port_user: str) -> Any:
    import psycopg

    host, port, user = host_port_user.split(":")
    return psycopg.connect(host=host, port=port, user=user, dbname="postgres", autocommit=True)


def per_call_us(seconds: float, calls: int) -> float:
    return seconds / calls * 1e6


def time_transactions(label: str, body: Any, n: int) -> dict[str, Any]:
    from django.db import transaction

    start = time.perf_counter()
    for i in range(n):
        with transaction.atomic():
            body(i)
    elapsed = time.perf_counter() - start
    print(f"{label:<46} {per_call_us(elapsed, n):8.0f} us/transaction  "
          f"{n / elapsed:8,.0f} /s")
    return {"label": label, "us_per_transaction": round(per_call_us(elapsed, n), 1),
            "per_s": round(n / elapsed)}


def ready_count(client: Any) -> int:
    return int(client.zcard("{dq:default}:ready"))


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--transactions", type=int, default=None,
                        help=f"transactions of each kind (default {TRANSACTIONS:,} x scale)")
    parser.add_argument("--rows", type=int, default=None,
                        help=f"rows waiting for Redis (default {ROWS:,} x scale)")
    parser.add_argument("--samples", type=int, default=None,
                        help=f"relay latency samples (default {SAMPLES} x scale)")
    opts = parser.parse_args(argv)
    opts.transactions = opts.transactions or record.scaled(TRANSACTIONS, opts.scale, 5)
    opts.rows = opts.rows or record.scaled(ROWS, opts.scale, 20)
    opts.samples = opts.samples or record.scaled(SAMPLES, opts.scale, 2)
    this_run = record.Run("outbox", opts.scale)
    db_name = f"delayq_bench_{uuid.uuid4().hex[:8]}"
    with postgres() as pg:
        with admin_connection(pg) as admin:
            admin.execute(f'CREATE DATABASE "{db_name}"')
        server = RedisServer().start()
        try:
            configure(pg, server.url, db_name)
            figures = run(server, opts)
        finally:
            server.cleanup()
            from django.db import connections

            connections.close_all()
            with admin_connection(pg) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
    this_run.write(opts.out, figures)


def run(server: RedisServer, opts: argparse.Namespace) -> dict[str, Any]:
    from django.core.management import call_command
    from django.db import transaction
    from django.test import override_settings

    from django_delayq import task
    from django_delayq.connection import get_broker
    from django_delayq.models import OutboxEntry
    from django_delayq.outbox import Relay
    from django_delayq.services import RelayService

    call_command("migrate", verbosity=0)

    @task(name="bench.noop")
    def noop(i: int) -> None:
        """Never run: the benchmark only enqueues."""

    from django.db import connection

    with connection.cursor() as cursor:  # the application's own write in each transaction
        cursor.execute("CREATE TABLE bench_order (id bigserial PRIMARY KEY, n integer)")

    def write_order(i: int) -> None:
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_order (n) VALUES (%s)", [i])

    client = get_broker().client
    n = opts.transactions
    print(f"PostgreSQL, {n:,} transactions of one INSERT and one enqueue each, load average "
          f"{record.load()[0]:.2f}")
    noop.enqueue(0)  # loads the script, opens the connections
    timed = [time_transactions("an INSERT alone (no job)", write_order, n),
             time_transactions("INSERT + enqueue_on_commit",
                               lambda i: (write_order(i), noop.enqueue_on_commit(i)), n),
             time_transactions("INSERT + enqueue_in_transaction (hook sends)",
                               lambda i: (write_order(i), noop.enqueue_in_transaction(i)), n)]
    assert OutboxEntry.objects.count() == 0
    no_hook = {**settings.DELAYQ, "OUTBOX": {**settings.DELAYQ["OUTBOX"], "FAST_PATH": False}}
    with override_settings(DELAYQ=no_hook):
        timed.append(time_transactions(
            "INSERT + enqueue_in_transaction (no hook)",
            lambda i: (write_order(i), noop.enqueue_in_transaction(i)), n))
        relay = Relay()
        start = time.perf_counter()
        relay.run(burst=True)
        elapsed = time.perf_counter() - start
        print(f"relay of those {relay.sent:,} rows (chunks of {relay.chunk_size}): "
              f"{elapsed:.2f} s, {relay.sent / elapsed:,.0f} rows/s")
    relayed = {"rows": relay.sent, "chunk": relay.chunk_size, "seconds": round(elapsed, 3),
               "rows_per_s": round(relay.sent / elapsed)}

    # Rows written while Redis is down; a relay thread waits for it to come back.
    client.flushall()
    server.stop()
    rows = opts.rows
    with transaction.atomic():
        for i in range(rows):
            noop.enqueue_in_transaction(i)  # the commit hook fails: the rows wait
    assert OutboxEntry.objects.count() == rows
    get_broker().close()
    thread = Background(RelayService("default"))
    time.sleep(3.0)  # the relay backs off for a while (up to 5 s between tries)
    server.start()
    back = time.perf_counter()
    first = last = None
    while last is None:
        count = ready_count(client) if _reachable(client) else 0
        now = time.perf_counter()
        if count and first is None:
            first = now
        if count >= rows:
            last = now
        time.sleep(0.002)
    thread.stop()
    assert first is not None
    span = last - first
    rate = f"{rows / span:,.0f} rows/s once sending" if span >= 0.05 else "in one poll"
    print(f"Redis back after 3 s down, {rows:,} rows waiting: first job in Redis after "
          f"{(first - back) * 1000:,.0f} ms, all after {(last - back) * 1000:,.0f} ms "
          f"({rate})")
    comeback = {"rows": rows, "down_s": 3.0, "first_ms": round((first - back) * 1000),
                "all_ms": round((last - back) * 1000),
                "rows_per_s": round(rows / span) if span >= 0.05 else None}

    # Only the relay: latency from commit to job in Redis, with a relay thread polling.
    client.flushall()
    with override_settings(DELAYQ=no_hook):
        thread = Background(RelayService("default"))
        latencies = []
        for i in range(opts.samples):
            with transaction.atomic():
                job = noop.enqueue_in_transaction(i)
            committed = time.perf_counter()
            key = f"{{dq:default}}:j:{job.id}"
            while not client.exists(key):
                time.sleep(0.001)
            latencies.append((time.perf_counter() - committed) * 1000)
        thread.stop()
    latencies.sort()
    print(f"relay only (POLL_INTERVAL {POLL_INTERVAL} s), commit to job in Redis over "
          f"{len(latencies)} samples: p50 {statistics.median(latencies):,.0f} ms, "
          f"max {latencies[-1]:,.0f} ms")
    return {"transactions": n, "timed": timed, "relay": relayed, "redis_back": comeback,
            "relay_only": {"poll_interval_s": POLL_INTERVAL, "samples": len(latencies),
                           "p50_ms": round(statistics.median(latencies), 1),
                           "max_ms": round(latencies[-1], 1)}}


class Background:
    """A host's service run on a thread of this process, as a host runs it."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.thread = threading.Thread(target=service.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.service.stop(drain=False)
        self.thread.join(10)


def _reachable(client: Any) -> bool:
    try:
        client.ping()
    except Exception:
        return False
    return True


if __name__ == "__main__":
    main()
