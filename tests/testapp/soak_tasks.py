"""Tasks of the soak tests (``tests/test_soak.py``): many of their jobs go through a real
``runworker`` again and again. Those that call sync code count their runs in Redis."""

from __future__ import annotations

import asyncio
import json
import os
import time

from asgiref.sync import sync_to_async

from django_delayq import task
from django_delayq.connection import get_broker

#: A hash: tag -> how many times a job with that tag ran.
RUNS = "test:soak"
#: A list: the process that ran each job of the sharing test.
PIDS = "test:soak:pids"
SYNC, ASYNC, ASYNC_SYNC, MIXED = "soak_sync", "soak_async", "soak_async_sync", "soak_mixed"


def count_run(tag: str) -> None:
    get_broker().client.hincrby(RUNS, tag, 1)


@task(queue=SYNC)
def soak_sync(tag: str) -> str:
    count_run(tag)
    return tag


@task(queue=SYNC, max_attempts=2, retry_backoff=0)
def soak_fails_once(tag: str) -> str:
    """Fail at the first run, retried at once; complete at the second (after a
    millisecond of work: the retry is claimed while others run)."""
    if get_broker().client.hincrby(RUNS, tag, 1) == 1:
        raise RuntimeError(f"{tag}: first run")
    sum(range(20_000))
    return tag


@task(queue=ASYNC)
async def soak_async(tag: str) -> str:
    """Pure asyncio: nothing but an await of the loop's timer."""
    await asyncio.sleep(0.001)
    return tag


@task(queue=ASYNC_SYNC)
async def soak_async_sync(tag: str) -> str:
    """Await the loop, then count the run through sync code (sync_to_async)."""
    await asyncio.sleep(0.001)
    await sync_to_async(count_run)(tag)
    return tag


@task(queue=MIXED)
def soak_mixed_sync(tag: str) -> str:
    count_run(tag)
    return tag


@task(queue=MIXED)
async def soak_mixed_async(tag: str) -> str:
    await asyncio.sleep(0.001)
    await sync_to_async(count_run)(tag)
    return tag


@task(queue=SYNC)
def soak_sleeps(tag: str, seconds: float) -> str:
    """Take ``seconds`` on a thread; note the run and the process."""
    time.sleep(seconds)
    count_run(tag)
    get_broker().client.rpush(PIDS, json.dumps({"tag": tag, "pid": os.getpid()}))
    return tag


@task(queue=ASYNC_SYNC)
async def soak_async_sleeps(tag: str, seconds: float) -> str:
    """Take ``seconds`` on the event loop; note the run and the process."""
    await asyncio.sleep(seconds)
    await sync_to_async(soak_sleeps.call)(tag, 0)
    return tag


@task(queue=SYNC)
def soak_step(*results: object, tag: str) -> str:
    """A workflow step: takes its parents' results first, counts the run of ``tag``."""
    count_run(tag)
    return tag


@task(queue=SYNC)
def soak_join(results: list[object], *, tag: str) -> list[object]:
    """A group's callback: counts the run of ``tag``, returns the members' results."""
    count_run(tag)
    return results
