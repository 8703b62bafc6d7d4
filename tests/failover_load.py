"""The load and the measures the failover soaks share (``tests/test_failover.py``,
``tests/test_failover_command.py``): producers with known job ids, the workers and their
mirror database, what is measured once the queue has drained, the timeline of each run,
and the checks that must hold whatever the kind of failover.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from django_delayq import DelayQConnectionError, NotReplicated
from django_delayq.engine import Broker, EngineConfig, EnqueueRequest
from django_delayq.engine.fields import stored
from django_delayq.testing import RedisServer
from tests.conftest import ROOT, OutputReader, wait_until, worker_env
from tests.failover_checks import (
    HELD_DELAY,
    Scraper,
    bring_due,
    held_started_before,
    is_held,
    mirror_lag,
)
from tests.servers import RedisCluster, RedisSentinelGroup
from tests.test_mirror_faults import sqlite_rows
from tests.testapp.fault_tasks import RUNS, count_run

#: Jobs per set of producers; the Sentinel run has two sets (5,000 jobs in all).
JOBS = 2_500
QUEUE = "ha"
#: The queue of the producers with MIN_REPLICAS=0, next to them in the same run.
QUEUE_0 = "ha0"
#: Seconds an enqueue keeps retrying through the failover (producers and workers).
FAILOVER_RETRY = 30.0
REPLICA_TIMEOUT = 0.5


@dataclass
class Producers:
    """Two producer threads, one enqueuing jobs one by one, one in chunks of 100, each
    job with an id chosen before its first try; a call that raised is tried again with
    the same ids (safe: an existing id is not added twice)."""

    broker: Broker
    label: str
    queue: str = QUEUE
    jobs: int = JOBS
    #: Ids whose enqueue call returned (the promise made to the caller).
    returned: list[str] = field(default_factory=list)
    #: Ids whose call raised NotReplicated or DelayQConnectionError at least once.
    refused: set[str] = field(default_factory=set)
    errors: list[BaseException] = field(default_factory=list)
    progress: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    #: (start, end) wall-clock seconds of every call that returned, and its job ids.
    calls: list[tuple[float, float, list[str]]] = field(default_factory=list)
    #: Ids of the jobs held past the switch (:func:`~tests.failover_checks.is_held`).
    held: set[str] = field(default_factory=set)
    #: When the held jobs were brought due (none may start before).
    held_at: float = 0.0

    def first_return_after(self, moment: float, among: Callable[[str], bool]) -> float | None:
        """Seconds from ``moment`` until the first call started after it returned, of
        the calls with a job ``among`` selects."""
        ends = [end for start, end, ids in self.calls
                if start >= moment and any(among(job_id) for job_id in ids)]
        return min(ends) - moment if ends else None

    def request(self, job_id: str, i: int) -> EnqueueRequest:
        # One job in ten is delayed 1-2 s: due ones must never start early. One in 20 is
        # held past the switch: brought due once the failover is over.
        delay: int | None = 1 + (i % 2) if i % 10 == 0 else None
        if is_held(i):
            delay = HELD_DELAY
            self.held.add(job_id)
        return EnqueueRequest(task=count_run.name, args=[job_id], job_id=job_id,
                              max_attempts=1000, delay=delay)

    def start(self) -> None:
        half = self.jobs // 2
        self.threads = [threading.Thread(target=self._guard, args=(self._singles, half)),
                        threading.Thread(target=self._guard,
                                         args=(self._bulk, self.jobs - half))]
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(timeout=180)
        assert not any(t.is_alive() for t in self.threads), "a producer hung"
        assert not self.errors, self.errors

    def _guard(self, target: Callable[[int], None], n: int) -> None:
        try:
            target(n)
        except BaseException as exc:
            self.errors.append(exc)

    def _again(self, ids: list[str], send: Callable[[], Any]) -> None:
        for _ in range(100):
            start = time.time()
            try:
                send()
            except (NotReplicated, DelayQConnectionError):
                self.refused.update(ids)
                continue
            self.calls.append((start, time.time(), ids))
            self.returned += ids
            if len(self.returned) >= self.jobs // 4:
                self.progress.set()
            return
        raise AssertionError(f"{ids[0]}: not enqueued after 100 tries")

    def _singles(self, n: int) -> None:
        for i in range(n):
            job_id = f"{self.label}-s{i}"
            request = self.request(job_id, i)
            self._again([job_id], lambda r=request: self.broker.enqueue(
                self.queue, r.task, r.args, job_id=r.job_id, max_attempts=r.max_attempts,
                delay=r.delay))

    def _bulk(self, n: int) -> None:
        for start in range(0, n, 100):
            requests = [self.request(f"{self.label}-b{i}", i)
                        for i in range(start, min(n, start + 100))]
            self._again([r.job_id for r in requests if r.job_id],
                        lambda rs=requests: self.broker.enqueue_many(self.queue, rs))


@pytest.fixture(scope="module")
def migrated_db(tmp_path_factory: Any) -> Path:
    """A migrated SQLite database for the mirror, made once and copied by each test."""
    path = tmp_path_factory.mktemp("failover") / "template.sqlite3"
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT,
                   env=worker_env(None, DELAYQ_TEST_SQLITE=str(path)), check=True, timeout=120)
    return path


@pytest.fixture
def mirror_db(migrated_db: Path, tmp_path: Path) -> str:
    path = tmp_path / "mirror.sqlite3"
    shutil.copy(migrated_db, path)
    return str(path)


@pytest.fixture
def workers(spawned: Any) -> Callable[..., tuple[subprocess.Popen[str], OutputReader]]:
    """Start ``runworker`` on both queues with its mirror process writing to ``db``."""

    def start(url: str, db: str, settings: dict[str, Any]) -> tuple[subprocess.Popen[str],
                                                                    OutputReader]:
        return spawned(QUEUE, QUEUE_0, "-c", "4", "--lease", "3", redis_url=url,
                       env={"DELAYQ_TEST_SQLITE": db,
                            "DELAYQ_TEST_SETTINGS": json.dumps(settings)})

    return start


@dataclass
class Measured:
    returned: int
    lost: list[str]
    duplicated: int
    early: list[str]
    mirror_mismatch: dict[str, tuple[str | None, str | None]]
    #: Rows the mirror keeps of this set's jobs that Redis no longer has.
    orphan_rows: list[str]
    #: Wall-clock ms each job finished at (Redis' clock: the same machine here).
    finished_ms: dict[str, int]

    def first_finish_after(self, moment: float, among: Callable[[str], bool]) -> float | None:
        after = [ms / 1000 for job_id, ms in self.finished_ms.items()
                 if ms / 1000 > moment and among(job_id)]
        return min(after) - moment if after else None


def settle(client: Any, producers: Producers, db: str, out: list[OutputReader]) -> Measured:
    """Wait until every job Redis still holds is completed and the mirror agrees, then
    measure what was lost, run twice or started early, and which rows the mirror keeps
    of jobs Redis lost."""
    broker, ids, queue = producers.broker, producers.returned, producers.queue
    shards = broker.shards(queue)

    def fields_of(job_ids: list[str]) -> list[list[str | None]]:
        pipe = client.pipeline(transaction=False)
        for job_id in job_ids:
            pipe.hmget(broker.keys_for(queue, job_id).job(job_id),
                       [stored("status"), stored("run_at"), stored("started_at"),
                        stored("finished_at")])
        return list(pipe.execute())

    def drained() -> bool:
        pending = sum(client.zcard(k.scheduled) + client.zcard(k.ready) + client.zcard(k.active)
                      for k in shards)
        return pending == 0 and all(f[0] in (None, "completed") for f in fields_of(ids))

    logs = lambda: "\n".join(o.text[-2000:] for o in out)  # noqa: E731
    wait_until(drained, timeout=120, interval=0.3, message=f"the queue to drain:\n{logs()}")
    found = dict(zip(ids, fields_of(ids), strict=True))
    lost = [job_id for job_id, f in found.items() if f[0] is None]
    early = [job_id for job_id, (_, run_at, started, _) in found.items()
             if started is not None and run_at is not None and int(started) < int(run_at)]
    runs = client.hgetall(RUNS)

    def mismatch() -> dict[str, tuple[str | None, str | None]]:
        rows = sqlite_rows(db)
        return {job_id: (f[0], rows.get(job_id)) for job_id, f in found.items()
                if f[0] is not None and rows.get(job_id) != f[0]}

    try:
        wait_until(lambda: not mismatch(), timeout=180, interval=0.3, message="the mirror")
    except pytest.fail.Exception:
        left = mismatch()  # (Redis' status, the row's) of each job they disagree on
        detail = {job_id: client.hgetall(broker.keys_for(queue, job_id).job(job_id))
                  for job_id in list(left)[:3]}
        pytest.fail(f"after 180 s the mirror still differs from Redis on {len(left)} jobs, "
                    f"e.g. {dict(list(left.items())[:10])}; their job hashes: {detail}\n"
                    f"{logs()}")
    # Rows of this set's jobs, returned or not, whose job Redis no longer has.
    mine = sorted(j for j in sqlite_rows(db) if j.startswith(f"{producers.label}-"))
    orphans = [job_id for job_id, f in zip(mine, fields_of(mine), strict=True) if f[0] is None]
    return Measured(len(ids), lost, sum(1 for i in ids if int(runs.get(i, 0)) > 1), early,
                    mismatch(), orphans,
                    {job_id: int(f[3]) for job_id, f in found.items() if f[3] is not None})


class Timeline:
    """What happened when, in seconds after the SIGKILL: the failover's own events and
    what producers and workers saw, so each run's figures can be explained."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.killed_at = 0.0
        self.events: list[tuple[float, str]] = []

    def kill(self, server: RedisServer) -> None:
        self.killed_at = time.time()
        server.kill()

    def note(self, what: str, at: float | None = None) -> None:
        self.events.append(((time.time() if at is None else at) - self.killed_at, what))

    def seen(self, label: str, producers: Producers, measured: Measured,
             among: Callable[[str], bool]) -> tuple[str, str]:
        """Note the first enqueue and the first completed job after the kill, of the jobs
        ``among`` selects (those the killed primary served); return them as text."""
        enqueued = producers.first_return_after(self.killed_at, among)
        finished = measured.first_finish_after(self.killed_at, among)
        anywhere = measured.first_finish_after(self.killed_at, lambda _: True)
        for what, delay in (("first enqueue that returned", enqueued),
                            ("first job completed", finished),
                            ("first job completed, any shard", anywhere)):
            if delay is not None:
                self.note(f"{label}: {what}", self.killed_at + delay)
        return (f"{enqueued:.1f} s" if enqueued is not None else "none",
                f"{finished:.1f} s" if finished is not None else "none")

    def write(self) -> str:
        text = "\n".join(f"{at:+8.3f} s  {what}" for at, what in sorted(self.events))
        folder = ROOT / "test-artifacts" / "failover"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{self.name}.txt").write_text(text + "\n")
        print(f"failover timeline ({self.name}):\n{text}")
        return text


#: A Redis log line: ``pid:role dd Mon yyyy hh:mm:ss.mmm level message``.
LOG_LINE = re.compile(r"^\d+:\w (\d+ \w+ \d+ [\d:.]+) . (.*)$")
#: The sentinel events of a failover (logged at warning level, as the test servers run).
SENTINEL_EVENTS = ("+sdown", "+odown", "+try-failover", "+elected-leader", "+selected-slave",
                   "+promoted-slave", "+switch-master", "+failover-end", "-failover-abort")


def note_sentinel_events(timeline: Timeline, group: RedisSentinelGroup) -> None:
    """Note the first time any sentinel logged each failover event."""
    first: dict[str, tuple[float, str]] = {}
    for sentinel in group.sentinels:
        log = Path(sentinel.dir, "redis.log")
        for line in log.read_text().splitlines() if log.exists() else []:
            found = LOG_LINE.match(line)
            if not found:
                continue
            message = found.group(2)
            event = message.split(" ", 1)[0]
            if event not in SENTINEL_EVENTS and not event.startswith("+failover-state"):
                continue
            at = dt.datetime.strptime(found.group(1), "%d %b %Y %H:%M:%S.%f").timestamp()
            if at >= timeline.killed_at - 1 and (event not in first or at < first[event][0]):
                first[event] = (at, f"sentinel {sentinel.port}: {message}")
    for at, what in first.values():
        timeline.note(what, at)


class ClusterWatch:
    """Polls a live node's view of the cluster every 0.1 s and notes each change of the
    killed node's flags and of the primary serving the watched slots."""

    def __init__(self, timeline: Timeline, cluster: RedisCluster, killed: int,
                 keys: dict[str, str]) -> None:
        self.timeline, self.cluster, self.killed, self.keys = timeline, cluster, killed, keys
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ClusterWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        last: dict[str, str] = {}
        while not self._stop.wait(0.1):
            try:
                state = self._state()
            except redis.RedisError:
                continue
            for what, value in state.items():
                if last.get(what) != value:
                    self.timeline.note(f"{what}: {value}")
            last = state

    def _state(self) -> dict[str, str]:
        port = next(p for p in self.cluster.ports if p != self.killed)
        with redis.Redis(port=port, decode_responses=True, socket_timeout=1) as client:
            nodes = client.execute_command("CLUSTER NODES")
            state = {f"node {self.killed} (killed) as seen by {port}":
                     next((info["flags"] for address, info in nodes.items()
                           if address.split("@")[0].endswith(f":{self.killed}")), "?")}
            for label, key in self.keys.items():
                slot = int(client.execute_command("CLUSTER KEYSLOT", key))
                owner = next((int(primary[1]) for start, end, primary, *_ in
                              client.execute_command("CLUSTER SLOTS")
                              if int(start) <= slot <= int(end)), None)
                state[f"{label} served by"] = f"port {owner}"
        return state


def engine_config(min_replicas: int, **more: Any) -> EngineConfig:
    return EngineConfig(min_replicas=min_replicas,
                        min_replicas_timeout_ms=int(REPLICA_TIMEOUT * 1000),
                        failover_retry_ms=int(FAILOVER_RETRY * 1000), **more)


def report(fault_report: Callable[..., None], what: str, timeline: Timeline,
           sets: list[tuple[int, Producers, Measured]],
           served: Callable[[Producers, str], bool] = lambda producers, job_id: True) -> None:
    """A fault summary row per set of producers, with the delays the timeline saw for
    the jobs the killed primary ``served``."""
    for n, producers, measured in sets:
        enqueued, finished = timeline.seen(f"MIN_REPLICAS={n}", producers, measured,
                                           lambda job_id, p=producers: served(p, job_id))
        fault_report(f"{what}, MIN_REPLICAS={n} ({len(producers.refused)} enqueue calls "
                     f"raised, then retried; first enqueue {enqueued}, first job done "
                     f"{finished} after the kill; {len(measured.orphan_rows)} mirror rows "
                     f"of lost jobs)", measured.returned, len(measured.lost),
                     measured.duplicated)
        timeline.note(f"MIN_REPLICAS={n}: {measured.returned} returned, "
                      f"{len(measured.lost)} lost, {measured.duplicated} run twice, "
                      f"{len(measured.orphan_rows)} mirror rows of lost jobs")
    timeline.write()


@dataclass
class AfterSwitch:
    """What the checks beyond the jobs found: held jobs Redis lost or that started before
    they were brought due, and counter series that went down between two scrapes."""

    held: dict[int, int] = field(default_factory=dict)
    held_missing: dict[int, list[str]] = field(default_factory=dict)
    held_early: dict[int, list[str]] = field(default_factory=dict)
    decreases: list[str] = field(default_factory=list)
    #: Scrapes Redis answered after the failover began; errors other than unreachable.
    scrapes_after: int = 0
    scrapes_before: int = 0
    scrape_errors: list[BaseException] = field(default_factory=list)


def release_held(client: Any, sets: dict[int, Producers], found: AfterSwitch) -> None:
    """Once the failover is over: bring every acknowledged held job due (those Redis no
    longer has are noted)."""
    for n, producers in sets.items():
        ids = sorted(producers.held & set(producers.returned))
        moment, found.held_missing[n] = bring_due(producers.broker, producers.queue, ids)
        found.held[n] = len(ids)
        producers.held_at = moment


def check_after_settle(client: Any, sets: dict[int, Producers], scraper: Scraper,
                       found: AfterSwitch, timeline: Timeline) -> None:
    """Held jobs that started early; the scrapes' decreases; the mirror-lag gauge, which
    must read 0 now that the mirror equals Redis."""
    for n, producers in sets.items():
        ids = sorted(producers.held & set(producers.returned))
        found.held_early[n] = held_started_before(client, producers.broker, producers.queue,
                                                  ids, producers.held_at)
        timeline.note(f"MIN_REPLICAS={n}: {found.held[n]} held jobs acknowledged, "
                      f"{len(found.held_missing[n])} gone from Redis, "
                      f"{len(found.held_early[n])} started before brought due")
    broker = sets[1].broker
    queues = [p.queue for p in sets.values()]
    wait_until(lambda: set(mirror_lag(broker, queues).values()) == {0}, timeout=60,
               interval=0.3, message=f"the lag gauge at 0: {mirror_lag(broker, queues)}")
    # Scrapes are refused while a sentinel says a failover is under way; the jobs may
    # settle before the sentinels all end it.
    wait_until(lambda: scraper.answered_after(timeline.killed_at) > 0, timeout=60,
               interval=0.25, message=f"a scrape answered after the failover began "
               f"({scraper.refused} refused, errors {scraper.errors[:3]})")
    found.decreases, found.scrape_errors = scraper.decreases(), scraper.errors
    found.scrapes_after = scraper.answered_after(timeline.killed_at)
    found.scrapes_before = len(scraper.scrapes) - found.scrapes_after
    timeline.note(f"{len(scraper.scrapes)} scrapes, {found.scrapes_after} after the "
                  f"failover began ({scraper.refused} refused, {len(scraper.errors)} "
                  f"errors), "
                  f"{len(found.decreases)} counter decreases: {found.decreases[:5]}")


def check_promises(measured: dict[int, Measured], found: AfterSwitch) -> None:
    """What must hold whatever the setting, and the loss MIN_REPLICAS=1 rules out."""
    for n in (1, 0):
        assert measured[n].returned == JOBS
        assert measured[n].early == [], "no job may start before its run_at"
        assert found.held_early[n] == [], "no held job may start before it is due"
        assert measured[n].mirror_mismatch == {}
    assert found.held[1] > 0
    assert found.held_missing[1] == [], \
        "MIN_REPLICAS=1: every acknowledged job held past the switch is still in Redis"
    assert found.scrape_errors == []
    assert found.scrapes_before > 0
    assert found.scrapes_after > 0
    assert found.decreases == [], "counter series never go down"
    assert measured[1].lost == [], "MIN_REPLICAS=1: every enqueue that returned survives"
    assert measured[1].orphan_rows == []
