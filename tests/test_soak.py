"""Many jobs through a real ``runworker``, run after run: every way a job runs (threads,
``async def`` tasks alone and beside sync ones, the process pool, workflows, the outbox
relay) completes every job exactly once, every time.

One job once proves little: async tasks once shipped stalling after their first job (the
event loop started on demand, and jobs handed to it while it was starting were dropped),
and every test then ran one async job at a time.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from django_delayq import JobSpec, Queue, chain, group
from tests.conftest import ROOT, OutputReader, kill_with_children, wait_until, worker_env
from tests.testapp import soak_tasks

pytestmark = pytest.mark.slow

#: Runs in a row, and jobs per run, of each way a job runs: each run a fresh worker
#: process, handed hundreds of jobs at once.
RUNS = 4
JOBS = 500

STOPPED = re.compile(r"worker stopped worker=(\S+) jobs=(\d+) completed=(\d+) retried=(\d+) "
                     r"failed=(\d+)")


def runworker(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "django", "runworker", *args], cwd=ROOT,
                            env=env or worker_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@contextmanager
def serving(*args: str, env: dict[str, str] | None = None) -> Iterator[OutputReader]:
    """A ``runworker ARGS`` for the block, stopped with SIGTERM after it (exit 0)."""
    proc = runworker(*args, env=env)
    out = OutputReader(proc)
    try:
        yield out
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, out.text
    finally:
        if proc.poll() is None:
            kill_with_children(proc)


def burst(*args: str) -> str:
    """``runworker --burst ARGS`` to its end (exit 0); its output."""
    proc = runworker("--burst", *args)
    try:
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            kill_with_children(proc)
    assert proc.returncode == 0, output
    return output


def per_worker(output: str) -> dict[str, tuple[int, int, int, int]]:
    """(jobs, completed, retried, failed) of each worker process, from its last line."""
    return {m[1]: (int(m[2]), int(m[3]), int(m[4]), int(m[5]))
            for m in STOPPED.finditer(output)}


def assert_each_ran_once(client: Any, queues: list[str], jobs: int, output: str, *,
                         counted: list[str] = ()) -> dict[str, tuple[int, int, int, int]]:
    """Every one of ``jobs`` jobs completed, none retried or run twice (the workers ran
    ``jobs`` in all); the tags of ``counted`` each ran once by the tasks' own count."""
    workers = per_worker(output)
    assert workers, output
    assert sum(w[0] for w in workers.values()) == jobs, output
    assert sum(w[1] for w in workers.values()) == jobs, output
    counts = {queue: Queue(queue).counts() for queue in queues}
    for queue, of_queue in counts.items():
        left = {status: n for status, n in of_queue.items() if status != "completed" and n}
        assert left == {}, (queue, of_queue)
    assert sum(of_queue["completed"] for of_queue in counts.values()) == jobs
    runs = Counter({tag: int(n) for tag, n in client.hgetall(soak_tasks.RUNS).items()})
    assert runs == Counter(dict.fromkeys(counted, 1))
    return workers


def tags(prefix: str, n: int = JOBS) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


@pytest.mark.parametrize("args", [("--concurrency", "1"), ("--concurrency", "4"),
                                  ("--processes", "2", "--no-mirror")],
                         ids=["c1", "c4", "pool"])
def test_async_jobs_all_complete_run_after_run(redis_client, args):
    """500 jobs of a pure asyncio task and 500 of one that calls sync code through
    sync_to_async, four runs in a row."""
    queues = [soak_tasks.ASYNC, soak_tasks.ASYNC_SYNC]
    for run in range(RUNS):
        redis_client.flushdb()
        soak_tasks.soak_async.enqueue_many([[tag] for tag in tags(f"p{run}-")])
        soak_tasks.soak_async_sync.enqueue_many([[tag] for tag in tags(f"s{run}-")])
        output = burst(*queues, *args)
        assert_each_ran_once(redis_client, queues, 2 * JOBS, output, counted=tags(f"s{run}-"))


def test_sync_jobs_on_threads_all_complete_run_after_run(redis_client):
    for run in range(RUNS // 2):
        redis_client.flushdb()
        soak_tasks.soak_sync.enqueue_many([[tag] for tag in tags(f"s{run}-")])
        output = burst(soak_tasks.SYNC, "--concurrency", "4", "--no-mirror")
        assert_each_ran_once(redis_client, [soak_tasks.SYNC], JOBS, output,
                             counted=tags(f"s{run}-"))


def test_jobs_retried_at_once_all_complete_run_after_run(redis_client):
    """Jobs that fail once and are retried with no backoff, enqueued one by one while a
    worker runs: it often claims a job's second attempt before its acker settled the
    first, and holds both leases at once. Every job completes at its second attempt,
    none is lost to a lapsed lease, and the worker goes on claiming."""
    queue = Queue(soak_tasks.SYNC)
    with serving(soak_tasks.SYNC, "--concurrency", "8", "--lease", "3",
                 "--no-mirror") as out:
        for run in range(RUNS):
            for tag in tags(f"r{run}-", 200):
                soak_tasks.soak_fails_once.enqueue(tag)
            wait_until(lambda run=run: queue.counts()["completed"] == 200 * (run + 1)
                       or queue.counts()["failed"], timeout=120,
                       message=f"run {run}: {queue.counts()}\n{out.text}")
            assert {s: n for s, n in queue.counts().items() if n} == {
                "completed": 200 * (run + 1)}, out.text
        after = soak_tasks.soak_sync.enqueue("after")
        wait_until(lambda: after.refresh().status == "completed", timeout=60,
                   message=f"a job after them to run:\n{out.text}")
    runs = Counter({tag: int(n) for tag, n in redis_client.hgetall(soak_tasks.RUNS).items()})
    assert runs == Counter({**dict.fromkeys(
        [t for run in range(RUNS) for t in tags(f"r{run}-", 200)], 2), "after": 1})


@pytest.mark.parametrize("args", [("--concurrency", "4"), ("--processes", "2", "--no-mirror")],
                         ids=["one", "pool"])
def test_async_and_sync_jobs_in_one_worker_all_complete(redis_client, args):
    """A worker serving a queue of async tasks, one of sync tasks and one that mixes
    both: each lane claims what it can run, and every job runs once."""
    queues = [soak_tasks.ASYNC_SYNC, soak_tasks.SYNC, soak_tasks.MIXED]
    for run in range(RUNS // 2):
        redis_client.flushdb()
        soak_tasks.soak_async_sync.enqueue_many([[t] for t in tags(f"a{run}-", 200)])
        soak_tasks.soak_sync.enqueue_many([[t] for t in tags(f"s{run}-", 200)])
        soak_tasks.soak_mixed_sync.enqueue_many([[t] for t in tags(f"ms{run}-", 50)])
        soak_tasks.soak_mixed_async.enqueue_many([[t] for t in tags(f"ma{run}-", 50)])
        output = burst(*queues, *args)
        assert_each_ran_once(redis_client, queues, 500, output,
                             counted=[*tags(f"a{run}-", 200), *tags(f"s{run}-", 200),
                                      *tags(f"ms{run}-", 50), *tags(f"ma{run}-", 50)])


def test_a_pool_serving_async_and_sync_queues_shares_the_work(redis_client):
    """Both children of a pool get jobs of both kinds: neither claims what it cannot
    run (async slots no longer widen a child's claims of sync jobs)."""
    with serving(soak_tasks.ASYNC_SYNC, soak_tasks.SYNC, "--processes", "2", "--no-mirror",
                 "--concurrency", "2") as out:
        wait_until(lambda: out.text.count("worker started worker=") == 2, timeout=60,
                   message=f"both children up:\n{out.text}")
        for run in range(3):
            # slow enough that a child cannot take every job before its sibling asks
            soak_tasks.soak_sleeps.enqueue_many([[f"s{run}-{i}", 0.05] for i in range(40)])
            soak_tasks.soak_async_sleeps.enqueue_many(
                [[f"a{run}-{i}", 0.05] for i in range(40)])
            wait_until(lambda run=run: len(redis_client.hgetall(soak_tasks.RUNS)) == 80 * (
                run + 1), timeout=60, message=f"the jobs of run {run}:\n{out.text}")
    runs = {tag: int(n) for tag, n in redis_client.hgetall(soak_tasks.RUNS).items()}
    assert set(runs.values()) == {1}
    by_pid = Counter(json.loads(x)["pid"] for x in redis_client.lrange(soak_tasks.PIDS, 0, -1))
    assert len(by_pid) == 2, by_pid
    assert min(by_pid.values()) >= 240 * 0.2, by_pid
    workers = per_worker(out.text)
    assert sorted(w[0] for w in workers.values()) == sorted(by_pid.values())


def test_workflows_all_complete_run_after_run(redis_client):
    """Chains and groups with callbacks, many at once: every step runs once, a burst
    runs the dependants its acks release, and each callback gets all of its members'
    results."""
    step = soak_tasks.soak_step
    for run in range(RUNS // 2):
        redis_client.flushdb()
        callbacks = []
        for i in range(20):
            chain(*(step.bind(tag=f"c{run}-{i}-{k}") for k in range(3))).enqueue()
            members = [step.bind(tag=f"g{run}-{i}-{k}") for k in range(10)]
            callbacks.append(group(members).then(
                soak_tasks.soak_join.bind(tag=f"g{run}-{i}-done")).enqueue().callback)
        output = burst(soak_tasks.SYNC, "--concurrency", "4", "--no-mirror")
        expected = [*(f"c{run}-{i}-{k}" for i in range(20) for k in range(3)),
                    *(f"g{run}-{i}-{k}" for i in range(20) for k in [*range(10), "done"])]
        assert_each_ran_once(redis_client, [soak_tasks.SYNC], len(expected), output,
                             counted=expected)
        for i, callback in enumerate(callbacks):
            assert callback.refresh().result == [f"g{run}-{i}-{k}" for k in range(10)]


def test_outbox_rows_are_relayed_and_run_once_round_after_round(redis_client, tmp_path):
    """Rows the commit did not send (the fast path off) go through the relay of a running
    ``runworker`` (in its mirror process), each job once."""
    env = worker_env(DELAYQ_TEST_SQLITE=str(tmp_path / "outbox.sqlite3"),
                     DELAYQ_TEST_SETTINGS=json.dumps({"OUTBOX": {"FAST_PATH": False}}))
    subprocess.run([sys.executable, "-m", "django", "migrate", "-v0"], cwd=ROOT, env=env,
                   check=True, timeout=120)
    write = ("import django, sys; django.setup()\n"
             "from django.db import transaction\n"
             "from tests.testapp.tasks import count_run\n"
             "for t in range(5):\n"
             "    with transaction.atomic():\n"
             "        for i in range(20):\n"
             "            count_run.enqueue_in_transaction(f'{sys.argv[1]}-{t}-{i}')\n")
    with serving("default", env=env) as out:
        for run in range(RUNS // 2):
            subprocess.run([sys.executable, "-c", write, f"o{run}"], cwd=ROOT, env=env,
                           check=True, timeout=120)
            wait_until(lambda run=run: len(redis_client.hgetall("test:count")) == 100 * (
                run + 1), timeout=60, message=f"the relayed jobs of round {run}:\n{out.text}")
    counted = {k: int(v) for k, v in redis_client.hgetall("test:count").items()}
    assert len(counted) == 100 * (RUNS // 2)
    assert set(counted.values()) == {1}
    assert "outbox relay sent" in out.text


def test_jobs_over_every_priority_all_complete(redis_client):
    """Jobs of one queue spread over the priorities, through one worker: all once."""
    specs = [JobSpec([f"p{i}"], priority=(i % 21) - 10) for i in range(JOBS)]
    soak_tasks.soak_sync.enqueue_many(specs)
    output = burst(soak_tasks.SYNC, "--concurrency", "4", "--no-mirror")
    assert_each_ran_once(redis_client, [soak_tasks.SYNC], JOBS, output,
                         counted=[f"p{i}" for i in range(JOBS)])
