"""Tasks of the fault and bad-input tests. Each notes its runs in Redis, so a test in
another process can count them (a job that ran twice is a duplicate)."""

from __future__ import annotations

import os
import time

from django_delayq import task
from django_delayq.connection import get_broker

RUNS = "test:runs"


def _client():
    return get_broker().client


@task(max_attempts=1000)
def count_run(tag: str) -> str:
    """Count one run of ``tag`` in the hash ``test:runs``."""
    _client().hincrby(RUNS, tag, 1)
    return tag


@task(max_attempts=10)
def fenced(tag: str) -> int:
    """Note the start, wait (at most 60 s) for ``release:<tag>:<pid>``, then return the pid,
    or raise if ``fail:<tag>:<pid>`` exists. Lets a test steer each process on its own."""
    client, pid = _client(), os.getpid()
    client.rpush(f"started:{tag}", pid)
    deadline = time.monotonic() + 60
    while not client.exists(f"release:{tag}:{pid}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"release:{tag}:{pid} never set")
        time.sleep(0.02)
    if client.exists(f"fail:{tag}:{pid}"):
        raise RuntimeError(f"late failure of {tag} in {pid}")
    return pid
