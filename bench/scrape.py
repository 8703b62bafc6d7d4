"""A scrape of the Prometheus metrics view with many queues: round trips, commands, time.

    python -m bench.scrape [--scale 1] [--queues 5000] [--repeat 5] [--baseline DIR]

One throwaway Redis holds a few queues (5) or many (5,000 x scale), each with one ready
and one scheduled job. A process of the project (Django configured, nothing else
running) then calls the metrics view ``--repeat`` times after one warm-up call and
reports, per scrape: the round trips to Redis (writes of commands on a connection: one
command or a whole pipeline), the commands Redis ran (``INFO commandstats``), the
response's size and the median wall time. ``--baseline DIR`` measures another checkout
of the project (its ``django_delayq`` package) the same way, on the same Redis, right
before this one, for a before/after. Writes ``scrape.json`` (in ``--out``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__:  # the measuring process runs this file by path, beside another checkout
    from bench import record

QUEUES = 5_000
TASK = "tests.testapp.tasks.record"


def populate(url: str, queues: int) -> None:
    """``queues`` queues with one ready and one scheduled job each (in a clean Redis)."""
    from django_delayq.engine import Broker, EnqueueRequest
    from django_delayq.engine.urls import client_from_url

    broker = Broker(client_from_url(url))
    broker.client.flushdb()
    for i in range(queues):
        broker.enqueue_many(f"q{i:05}", [EnqueueRequest(task=TASK, args=["now"]),
                                          EnqueueRequest(task=TASK, args=["later"],
                                                         delay=3600)])
    broker.close()


def measure_in(source: Path, url: str, repeat: int) -> dict[str, Any]:
    """Run the measuring process on the checkout ``source``."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env["PYTHONPATH"] = str(source)
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", url, str(repeat)],
        cwd=source, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"bench.scrape on {source} failed ({done.returncode})")
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def child(url: str, repeat: int) -> dict[str, Any]:
    """In the measuring process: scrape ``repeat`` times, counting."""
    import django
    from django.conf import settings

    settings.configure(
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "django_delayq"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        USE_TZ=True, LOGGING_CONFIG=None, DELAYQ={"REDIS_URL": url})
    django.setup()
    from django.test import RequestFactory
    from redis.connection import AbstractConnection

    from django_delayq.connection import get_broker
    from django_delayq.metrics import metrics_view

    trips = [0]
    original = AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        trips[0] += 1
        original(self, command, check_health)

    AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]
    client = get_broker().client
    request = RequestFactory().get("/metrics/delayq/")

    def calls() -> int:
        stats = client.info("commandstats")
        return sum(int(s["calls"]) for s in stats.values())

    size = len(metrics_view(request).content)  # warm-up: scripts, clock, connections
    times, round_trips, commands = [], [], []
    for _ in range(repeat):
        before = calls()
        trips[0] = 0
        started = time.perf_counter()
        response = metrics_view(request)
        times.append(time.perf_counter() - started)
        round_trips.append(trips[0])
        commands.append(calls() - before - 1)  # less the INFO read before the scrape
        assert response.status_code == 200, response.content[:200]
    return {"round_trips": max(round_trips), "commands": max(commands),
            "scrape_ms": round(statistics.median(times) * 1000, 1), "bytes": size}


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--queues", type=int, default=None,
                        help=f"queues of the large row (default {QUEUES:,} x scale)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another checkout measured the same way")
    options = parser.parse_args(argv)
    from django_delayq.testing import RedisServer

    many = options.queues or record.scaled(QUEUES, options.scale, 50)
    sources = [("current", record.ROOT)]
    if options.baseline is not None:
        sources.insert(0, ("baseline", options.baseline.resolve()))
    this_run = record.Run("scrape", options.scale)
    rows = []
    with RedisServer() as server:
        for queues in (5, many):
            populate(server.url, queues)
            for code, source in sources:
                row = {"code": code, "queues": queues,
                       **measure_in(source, server.url, options.repeat)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    figures: dict[str, Any] = {"repeat": options.repeat, "rows": rows}
    if options.baseline is not None:
        figures["baseline"] = str(options.baseline)
    this_run.write(options.out, figures)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        print(json.dumps(child(sys.argv[2], int(sys.argv[3]))))
    else:
        main()
