"""Workers alive: each worker's HASH and its heartbeat in the workers ZSET.

Workers write them (:func:`record_alive`, :func:`forget`). A worker is alive while its
last heartbeat is no older than :data:`ALIVE_MS`, the one definition every reader uses:
the admin dashboard and the API list the workers alive (:func:`live_workers`), the
metrics count them (:func:`count_alive`), the admin's warnings ask whether any is
(:func:`any_alive`), ``delayq_health`` reads every record still kept to report the dead
ones, and the mirror takes over the events of a worker that is not alive
(:func:`consumers_gone`). A worker whose heartbeat stops drops out of the ZSET after its
TTL, and its HASH expires. A record's ``role`` is ``worker`` or ``supervisor`` (the
parent of a ``runworker --processes N`` pool); a pool's workers name their supervisor
in ``supervisor``.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import socket
import uuid
from dataclasses import dataclass, field
from typing import Any

from .core import BrokerCore
from .errors import warn_once
from .failover import CALL_FAILED
from .jobhash import read_times, to_float, to_int

logger = logging.getLogger("django_delayq.engine")

#: Most workers :func:`live_workers` lists (newest heartbeats first).
MAX_LISTED = 1_000
#: A worker is alive while its last heartbeat is no older than this: it beats at least
#: every 10 s (a pool's supervisor every 5 s), so this is three missed heartbeats.
ALIVE_MS = 30_000
#: Fields every record of this process carries (a pool's child sets ``supervisor``).
PROCESS_INFO: dict[str, Any] = {}


def new_worker_name() -> str:
    """``host:pid:random``: unique among live workers, and says where one runs in a log."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def record_alive(broker: BrokerCore, name: str, ttl: int, info: dict[str, Any]) -> None:
    """Record ``name`` as alive now (Redis clock) with ``info``; forget long-dead workers."""
    keys = broker.global_keys
    now_ms = broker.server_time_ms()
    record = {"name": name, "host": socket.gethostname(), "pid": os.getpid(), "role": "worker",
              **PROCESS_INFO, **info, "heartbeat": now_ms}
    pipe = broker.client.pipeline(transaction=False)
    pipe.zadd(keys.workers, {name: now_ms})
    pipe.hset(keys.worker(name), mapping=record)
    pipe.hsetnx(keys.worker(name), "started", now_ms)
    pipe.expire(keys.worker(name), ttl)
    pipe.zremrangebyscore(keys.workers, "-inf", now_ms - ttl * 1000)
    served = [q for q in str(record.get("queues", "")).split(",") if q]
    if served:  # the queues a worker serves stay known while it runs
        pipe.sadd(keys.queues, *served)
    if record["role"] == "supervisor":
        pipe.zadd(keys.hosts, {name: now_ms})
        pipe.zremrangebyscore(keys.hosts, "-inf", now_ms - ttl * 1000)
    pipe.execute()


def forget(broker: BrokerCore, name: str) -> None:
    """Remove ``name`` from the workers alive (best effort: it expires anyway)."""
    keys = broker.global_keys
    try:
        pipe = broker.client.pipeline(transaction=False)
        pipe.zrem(keys.workers, name)
        pipe.zrem(keys.hosts, name)
        pipe.delete(keys.worker(name))
        pipe.execute()
    except CALL_FAILED:
        pass


@dataclass(slots=True)
class WorkerInfo:
    """One live worker as its heartbeat describes it (None: a value it did not give)."""

    name: str
    host: str
    pid: int | None
    queues: list[str]
    concurrency: int | None
    busy: int | None
    processed: int | None
    failed: int | None
    started: dt.datetime | None
    heartbeat: dt.datetime | None
    #: Seconds since the heartbeat, by the Redis clock.
    seconds_ago: float
    #: "worker", or "supervisor" for the parent of a process pool.
    role: str = "worker"
    #: The name of the supervisor of this worker's pool (None: not in a pool).
    supervisor: str | None = None
    #: Threads able to run jobs (a supervisor: its live worker processes).
    threads: int | None = None
    #: The worker's lease in seconds (its heartbeat comes every lease / 3, at most 10 s).
    lease: float | None = None
    #: Seconds its event loop of async jobs has run nothing (0: it runs, or it has none).
    loop_stalled: float = 0.0
    #: The ``(queue, id)`` of the jobs it ran at its last heartbeat (the first 32).
    running: list[tuple[str, str]] = field(default_factory=list)
    #: Fields of its record that could not be read: field -> what was found there.
    damaged: dict[str, str] = field(default_factory=dict)


def is_alive(heartbeat_ms: float, now_ms: int) -> bool:
    """Whether a worker whose last heartbeat was at ``heartbeat_ms`` is alive at
    ``now_ms`` (both by the Redis clock)."""
    return now_ms - heartbeat_ms <= ALIVE_MS


def count_alive(broker: BrokerCore) -> int:
    """How many worker processes are alive (hosts left out), in two commands whatever
    their number."""
    keys = broker.global_keys
    with broker.read_errors():
        oldest = broker.recent_server_time_ms() - ALIVE_MS
        pipe = broker.client.pipeline(transaction=False)
        pipe.zcount(keys.workers, oldest, "+inf")
        pipe.zcount(keys.hosts, oldest, "+inf")
        everyone, hosts = pipe.execute()
    return max(0, int(everyone) - int(hosts))


def served_queues(broker: BrokerCore) -> set[str]:
    """The queues some worker alive serves (as its record says), in two round trips
    whatever the number of queues. A host's record names the queues of its worker
    processes, alive or not: only the workers' own records count."""
    keys = broker.global_keys
    with broker.read_errors():
        oldest = broker.recent_server_time_ms() - ALIVE_MS
        names = broker.client.zrangebyscore(keys.workers, oldest, "+inf")
        pipe = broker.client.pipeline(transaction=False)
        for name in names:
            pipe.hmget(keys.worker(name), "queues", "role")
        replies = pipe.execute(raise_on_error=False) if names else []
    return {q for r in replies if isinstance(r, list) and isinstance(r[0], str)
            and r[1] != "supervisor" for q in r[0].split(",") if q}


def any_alive(broker: BrokerCore) -> bool:
    """Whether a worker process is alive."""
    return count_alive(broker) > 0


def live_workers(broker: BrokerCore, limit: int = MAX_LISTED, *,
                 include_dead: bool = False) -> list[WorkerInfo]:
    """The workers alive, newest heartbeat first (at most ``limit``).

    With ``include_dead``, also the workers whose heartbeat stopped but whose record is
    still kept (for its TTL, a minute or more): ``delayq_health`` reports those.
    """
    keys = broker.global_keys
    with broker.read_errors():
        now_ms = broker.server_time_ms()
        oldest = "-inf" if include_dead else now_ms - ALIVE_MS
        entries = broker.client.zrevrangebyscore(keys.workers, "+inf", oldest, start=0,
                                                 num=limit, withscores=True)
        pipe = broker.client.pipeline(transaction=False)
        for name, _ in entries:
            pipe.hgetall(keys.worker(name))
        infos = pipe.execute(raise_on_error=False) if entries else []
    workers = []
    for (name, beat), info in zip(entries, infos, strict=True):
        if isinstance(info, Exception):
            # A record that is not a hash (written by hand): skipped, named once.
            warn_once(logger, f"worker:{name}", "skipping a damaged worker record",
                      worker=name, error=info)

            continue
        if not info:
            continue  # its hash expired: the worker is gone
        # A damaged time reads as None and is named in ``damaged``, never raised.
        times, damaged = read_times({**info, "heartbeat": int(beat)}, "started", "heartbeat")
        workers.append(WorkerInfo(
            name=name, host=info.get("host", ""), pid=to_int(info.get("pid"), None),
            queues=[q for q in info.get("queues", "").split(",") if q],
            concurrency=to_int(info.get("concurrency"), None),
            busy=to_int(info.get("busy"), None),
            processed=to_int(info.get("processed"), None),
            failed=to_int(info.get("failed"), None),
            started=times["started"], heartbeat=times["heartbeat"],
            seconds_ago=max(0.0, (now_ms - beat) / 1000), damaged=damaged,
            role=info.get("role", "worker"), supervisor=info.get("supervisor") or None,
            threads=to_int(info.get("threads"), None), lease=to_float(info.get("lease")),
            loop_stalled=to_float(info.get("loop_stalled")) or 0.0,
            running=[(queue, job_id) for queue, _, job_id in
                     (ref.partition("/") for ref in info.get("running", "").split()) if job_id],
        ))
    return workers


#: The model mirror and the lake export on a worker's threads consume as
#: ``<worker name>/mirror`` and ``<worker name>/lake``: one consumer per process.
MIRROR_SUFFIX = "/mirror"
LAKE_SUFFIX = "/lake"


def mirror_consumer(worker_name: str) -> str:
    """The consumer name of the model mirror running on worker ``worker_name``."""
    return f"{worker_name}{MIRROR_SUFFIX}"


def lake_consumer(worker_name: str) -> str:
    """The consumer name of the lake export running on worker ``worker_name``."""
    return f"{worker_name}{LAKE_SUFFIX}"


def _pid_running(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def process_ended(host: str, pid: int | None) -> bool:
    """Whether process ``pid`` of ``host`` has ended; False for a process of another host
    (there only a heartbeat tells)."""
    return (pid is not None and pid > 0 and host == socket.gethostname()
            and not _pid_running(pid))


def consumers_gone(broker: BrokerCore, consumers: list[str]) -> set[str]:
    """The stream consumers (mirrors, lake exports) of ``consumers`` that are certainly
    no longer alive.

    One on a worker's thread (``<worker>/mirror``, ``<worker>/lake``) is gone when the
    worker's heartbeat says so: its record is gone (it stopped, or expired), it is not
    alive (:data:`ALIVE_MS`), or it ran on this host and its process has ended. One of
    its own (``delayq_mirror``, ``delayq_export``, named ``host:pid:...``) is gone when it
    ran on this host and its process has ended. Anything else is taken for alive. Taking
    for gone a consumer that is alive costs nothing but a repeated, idempotent write.
    """
    workers = {c: c.removesuffix(suffix) for c in consumers
               for suffix in (MIRROR_SUFFIX, LAKE_SUFFIX) if c.endswith(suffix)}
    gone: set[str] = set()
    if workers:
        keys = broker.global_keys
        now_ms = broker.server_time_ms()
        pipe = broker.client.pipeline(transaction=False)
        for name in workers.values():
            pipe.zscore(keys.workers, name)
            pipe.hmget(keys.worker(name), "host", "pid")
        replies = pipe.execute(raise_on_error=False)
        for consumer, beat, record in zip(workers, replies[0::2], replies[1::2], strict=True):
            # A damaged record (not a hash) says nothing of a live worker: gone.
            on_host, pid = (None, "") if isinstance(record, Exception) else record
            if (beat is None or not is_alive(beat, now_ms) or on_host is None
                    or process_ended(on_host, to_int(pid, None))):
                gone.add(consumer)
    for consumer in consumers:
        if consumer in workers:
            continue
        on_host, _, rest = consumer.partition(":")
        pid = rest.partition(":")[0]
        if pid.isdecimal() and int(pid) != os.getpid() and process_ended(on_host, int(pid)):
            gone.add(consumer)
    return gone
