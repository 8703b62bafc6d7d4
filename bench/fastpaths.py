"""Each fast path of the enqueue against the path it skips, side by side.

    python -m bench.fastpaths [--scale 1] [--rounds 30]

One process, one throwaway Redis, the public ``@task`` API: single enqueues
(``noop.enqueue()``) and bulk ones (``noop.enqueue_many``, chunks of 1,000). Each row
runs the same block of jobs with the fast path and without it (the path of redis-py's
public API, or the slower general one), in alternation (A B A B ..., the order flipped
every round), so a machine whose speed drifts slows both alike. A row gives each way's
median jobs per second, the median and quartiles of the per-round ratios (the gain), and
the CPU per job of this process and of Redis (``INFO cpu``). The paths:

- ``pinned``: connections pinned out of redis-py's pool (``engine/pinned.py``), against
  ``client.execute_command`` (a single enqueue) or a client pipeline (a bulk chunk);
- ``packed``: on a pinned connection, ``hiredis.pack_command`` and
  ``send_packed_command``, against ``Connection.send_command`` (redis-py's packer);
- ``shape``: the argument-shape check (``engine/fastpaths.py``), against
  ``inspect.Signature.bind``;
- ``plain``: the enqueue script without the workflow includes (``enqueue_plain``),
  against the whole ``enqueue.lua``.

Writes ``fastpaths.json`` (in ``--out``).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import statistics
import time
import types
from collections.abc import Callable
from typing import Any

import django
from django.conf import settings

from bench import record
from django_delayq.testing import RedisServer

SINGLE = 200  # single enqueues per block
BULK = 5_000  # jobs per bulk block
ROUNDS = 30


def setup(url: str) -> Any:
    """Django with only django-delayq, on ``url``, and a no-op task."""
    settings.configure(INSTALLED_APPS=["django_delayq"], USE_TZ=True, DATABASES={},
                       DELAYQ={"REDIS_URL": url}, LOGGING_CONFIG=None)
    django.setup()
    from django_delayq import task

    @task(name="bench.noop", queue="bench")
    def noop() -> None: ...

    return noop


def redis_cpu(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def measured(work: Callable[[], None], n: int, client: Any) -> tuple[float, float, float]:
    """``work`` (``n`` jobs): jobs per second, and CPU µs per job of this process and of
    Redis."""
    redis_before = redis_cpu(client)
    cpu, start = time.process_time(), time.perf_counter()
    work()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return n / wall, cpu * 1e6 / n, (redis_cpu(client) - redis_before) * 1e6 / n


def side_by_side(name: str, fast: Callable[[], Any], slow: Callable[[], Any],
                 work: Callable[[], None], n: int, rounds: int,
                 client: Any) -> dict[str, Any]:
    """``work`` (``n`` jobs) in alternating blocks, after ``fast()`` or ``slow()`` set
    the way up; ends with the fast way set."""
    runs: dict[str, list[tuple[float, float, float]]] = {"fast": [], "slow": []}
    ways = [("fast", fast), ("slow", slow)]
    for r in range(rounds):
        if r % 5 == 0:
            client.flushdb()  # Redis's memory stays alike for every block
        for way, arrange in ways if r % 2 == 0 else ways[::-1]:
            arrange()
            runs[way].append(measured(work, n, client))
    fast()
    ratios = [f[0] / s[0] for f, s in zip(runs["fast"], runs["slow"], strict=True)]
    q1, _, q3 = statistics.quantiles(ratios, n=4)

    def median(way: str, i: int) -> float:
        return round(statistics.median(run[i] for run in runs[way]), 2)

    row = {"row": name, "per_s": [median("fast", 0), median("slow", 0)],
           "gain": round(statistics.median(ratios) - 1, 4),
           "gain_quartiles": [round(q1 - 1, 4), round(q3 - 1, 4)],
           "client_us": [median("fast", 1), median("slow", 1)],
           "redis_us": [median("fast", 2), median("slow", 2)]}
    print(f"{name:16} {row['per_s'][0]:9,.0f}/s vs {row['per_s'][1]:9,.0f}/s  gain "
          f"{row['gain']:+6.1%} ({q1 - 1:+.1%} .. {q3 - 1:+.1%})  client µs/job "
          f"{row['client_us'][0]:5.1f} vs {row['client_us'][1]:5.1f}  Redis µs/job "
          f"{row['redis_us'][0]:5.1f} vs {row['redis_us'][1]:5.1f}")
    return row


def send_command(self: Any, *args: Any) -> Any:
    """``PinnedConnections.execute`` sending through redis-py's own packer."""
    conn = self._take()
    try:
        conn.send_command(*args)
        reply = conn.read_response()
    except BaseException:
        self._discard(conn)
        raise
    self._give_back(conn)
    return reply


def main(argv: list[str] | None = None) -> None:
    parser = record.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    opts = parser.parse_args(argv)
    single, bulk = record.scaled(SINGLE, opts.scale, 50), record.scaled(BULK, opts.scale, 1_000)
    this_run = record.Run("fastpaths", opts.scale)
    rows = []
    with RedisServer() as server:
        noop = setup(server.url)
        from django_delayq.connection import get_broker
        from django_delayq.engine import commands

        task_module = importlib.import_module("django_delayq.task")
        broker = get_broker()
        client, pins = broker.client, broker.commands.pinned
        assert pins is not None, "a plain client with a roomy pool pins connections"

        def singles() -> None:
            for _ in range(single):
                noop.enqueue()

        def bulks() -> None:
            noop.enqueue_many([()] * bulk)

        for owner, name in ((broker.commands, "pinned"), (pins, "execute"),
                            (task_module, "arg_shape"), (commands, "_enqueue_script")):
            assert hasattr(owner, name), f"{owner!r} has no {name}: the bench swaps it"
        noop.enqueue()  # connects, loads the script
        slow_send = types.MethodType(send_command, pins)
        real_shape, real_choice = task_module.arg_shape, commands._enqueue_script
        paths: list[tuple[str, Callable[[], Any], Callable[[], Any]]] = [
            ("pinned", lambda: setattr(broker.commands, "pinned", pins),
             lambda: setattr(broker.commands, "pinned", None)),
            ("packed", lambda: pins.__dict__.pop("execute", None),
             lambda: setattr(pins, "execute", slow_send)),
            ("shape", lambda: setattr(task_module, "arg_shape", real_shape),
             lambda: setattr(task_module, "arg_shape", lambda func: None)),
            ("plain", lambda: setattr(commands, "_enqueue_script", real_choice),
             lambda: setattr(commands, "_enqueue_script", lambda waits: "enqueue")),
        ]
        for path, fast, slow in paths:
            rows.append(side_by_side(f"{path}, single", fast, slow, singles, single,
                                     opts.rounds, client))
            rows.append(side_by_side(f"{path}, bulk", fast, slow, bulks, bulk,
                                     opts.rounds, client))
    this_run.write(opts.out, {"single": single, "bulk": bulk, "rounds": opts.rounds,
                              "redis_py": importlib.metadata.version("redis"), "rows": rows})


if __name__ == "__main__":
    main()
