"""Taking over the pending events of mirror consumers that are gone.

A worker SIGKILLed with its mirror process while the mirror held events it had read but
not acknowledged leaves them pending under its consumer name. The workers' heartbeats
say when a worker is gone (:func:`~django_delayq.engine.workers.consumers_gone`); its
entries are then claimed at once by the next mirror round, instead of after
``MIRROR_CLAIM_IDLE``, so a ``delayq_mirror --burst`` run ends with nothing pending.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from redis.exceptions import ResponseError

from ..engine import Broker
from ..engine.keys import QueueKeys
from ..engine.workers import consumers_gone

logger = logging.getLogger("django_delayq.mirror")

#: The consumer group every mirror reads through.
GROUP = "delayq-mirror"
#: A gone consumer's entry is taken once it has been idle this long (ms), so that of
#: the mirrors that see the consumer gone at about the same time, one takes it.
MIN_IDLE_MS = 1_000


def claim_from_gone(broker: Broker, keys: QueueKeys, me: str,
                    batch_size: int) -> Iterator[list[tuple[str, Any]]]:
    """Claim for ``me`` the pending entries of the consumers of ``keys.events`` that are
    gone, ``batch_size`` at a time; yield each batch to apply (entries already trimmed
    from the stream are acknowledged here, and yield an empty batch)."""
    client = broker.client
    try:
        consumers = [c["name"] for c in client.xinfo_consumers(keys.events, GROUP)
                     if c["pending"] and c["name"] != me]
    except ResponseError as exc:
        if "NOGROUP" not in str(exc):
            raise
        return
    for consumer in sorted(consumers_gone(broker, consumers)) if consumers else ():
        waited = False
        while True:
            waiting = client.xpending_range(keys.events, GROUP, min="-", max="+",
                                            count=batch_size, consumername=consumer)
            # Entries idle for MIN_IDLE_MS only: one mirror takes them (the claim resets
            # their idle time), not every mirror that saw the consumer gone.
            ids = [entry["message_id"] for entry in waiting
                   if entry["time_since_delivered"] >= MIN_IDLE_MS]
            if not ids:
                if not waiting or waited:
                    break
                # Delivered to the gone consumer moments before it died: nobody else
                # will touch them, so wait (once) the rest of MIN_IDLE_MS rather than
                # leave them (a --burst run would end with them still pending).
                waited = True
                idle = max(entry["time_since_delivered"] for entry in waiting)
                time.sleep(max(0, MIN_IDLE_MS - idle) / 1000 + 0.01)
                continue
            claimed = [(entry_id, fields) for entry_id, fields in
                       client.xclaim(keys.events, GROUP, me, MIN_IDLE_MS, ids)]
            if claimed:
                logger.info("mirror took over the pending events of a consumer that is gone "
                            "stream=%s consumer=%s count=%d", keys.events, consumer,
                            len(claimed))
            found = {entry_id for entry_id, _ in claimed}
            # An id not claimed was taken by another mirror, or trimmed from the stream
            # (nothing to apply: acknowledged here).
            trimmed = [entry_id for entry_id in ids if entry_id not in found
                       and not client.xrange(keys.events, entry_id, entry_id)]
            if trimmed:
                client.xack(keys.events, GROUP, *trimmed)
            if not claimed and not trimmed:
                break
            yield claimed
