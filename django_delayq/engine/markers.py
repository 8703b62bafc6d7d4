"""Waiting on the wake-up markers of queue shards (ZSETs that enqueues and claims mark
when work is ready or due): the one blocking read of an idle worker, which a stop ends
at once by marking the worker's own wake key (:func:`wake`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core import BrokerCore


def wait_for_mark(broker: BrokerCore, markers: Sequence[str], timeout: float) -> bool:
    """Block until one of ``markers`` has a mark (taking it), at most ``timeout`` seconds
    (BZPOPMIN: on a Cluster, the markers must share one slot). Returns whether one had."""
    with broker.read_errors():
        return bool(broker.client.bzpopmin(list(markers), timeout=timeout))


#: Seconds a wake mark or entry nobody took stays (a wait that had already returned).
WAKE_TTL_MS = 10_000


def wake_key(tag: str, owner: str) -> str:
    """The key a blocking read of ``owner`` also watches, in the slot of ``tag`` (the
    hash tag of the shards it reads, so that one command can name them together)."""
    return f"{tag}:wake:{owner}"


def wake(broker: BrokerCore, key: str) -> None:
    """End a :func:`wait_for_mark` that watches the marker ``key`` now."""
    with broker.connection_errors():
        pipe = broker.client.pipeline(transaction=False)
        pipe.zadd(key, {"wake": 0})
        pipe.pexpire(key, WAKE_TTL_MS)
        pipe.execute()
