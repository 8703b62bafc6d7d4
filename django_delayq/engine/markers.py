"""Waiting on the wake-up markers of queue shards (ZSETs that enqueues and claims mark
when work is ready or due): the one blocking read of an idle worker."""

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
