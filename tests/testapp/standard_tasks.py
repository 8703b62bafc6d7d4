"""Tasks declared with Django's Tasks API; settings.TASKS runs them on django-delayq."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from django_delayq.connection import get_broker

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def dj_add(a: int, b: int) -> int:
    return a + b


@task
def dj_take_anything(*args: Any, **kwargs: Any) -> None:
    """Takes any arguments: the codec tests compare what producers store."""


@task(queue_name="other", priority=5)
def dj_record(tag: str) -> str:
    get_broker().client.rpush("test:dj", tag)
    return tag


@task
def dj_fails(tag: str) -> None:
    raise ValueError(f"bad {tag}")


@task(takes_context=True)
def dj_context(context: Any, tag: str) -> dict[str, Any]:
    return {"id": context.task_result.id, "attempt": context.attempt, "tag": tag,
            "status": str(context.task_result.status)}


@task
def dj_gated(gate: str) -> str:
    """Wait (at most 60 s) until the key ``gate`` exists."""
    client = get_broker().client
    client.rpush("test:dj", json.dumps({"started": gate}))
    deadline = time.monotonic() + 60
    while not client.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        time.sleep(0.02)
    return gate


@task
def dj_exits(code: int) -> None:
    """Raise ``SystemExit``: a BaseException, which must still end as FAILED."""
    raise SystemExit(code)


@task
def dj_returns_unjsonable() -> object:
    return {1, 2}


@task(queue_name="async")  # a queue of its own, like the async tasks of tasks.py
async def dj_async_add(a: int, b: int) -> int:
    import asyncio

    await asyncio.sleep(0)
    return a + b


@task(queue_name="async")
async def dj_async_exits(code: int) -> None:
    raise SystemExit(code)


@task(queue_name="async")
async def dj_async_returns_unjsonable() -> object:
    return {1, 2}


@task(queue_name="async")
async def dj_async_fails(tag: str) -> None:
    raise ValueError(f"bad {tag}")


#: Set by a test to let the two tasks below return (they block until then, at most 60 s).
UNBLOCK = threading.Event()


@task
def dj_blocks_in_c() -> None:
    """Block in one C call (a lock wait) until UNBLOCK: no soft time limit reaches it."""
    UNBLOCK.wait(60)


@task(queue_name="async")
async def dj_async_blocks() -> None:
    """Block the event loop (a lock wait, not an await) until UNBLOCK: its cancellation
    cannot be delivered."""
    UNBLOCK.wait(60)


@task(takes_context=True)
def dj_steps(context: Any, gate: str) -> str:
    """Each attempt notes its start and waits (at most 60 s) for ``<gate>:<attempt>``;
    the first then fails, the next returns ``done``."""
    client = get_broker().client
    client.rpush("test:dj", json.dumps({"started": gate, "attempt": context.attempt}))
    deadline = time.monotonic() + 60
    while not client.exists(f"{gate}:{context.attempt}"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate}:{context.attempt} never opened")
        time.sleep(0.02)
    if context.attempt == 1:
        raise ValueError("the first attempt fails")
    return "done"


@task
def dj_progress(gate: str) -> str:
    """Report progress through delayq's ``current_job()``, then wait for ``gate``."""
    from django_delayq.current import current_job

    running = current_job()
    assert running is not None
    running.set_progress(0.5, "half way")
    client = get_broker().client
    deadline = time.monotonic() + 60
    while not client.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} never opened")
        time.sleep(0.02)
    running.set_progress(1.0, "done")
    return gate
